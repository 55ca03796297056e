"""bench/gil_handover.py end to end: a real null server, its big request timed alone and beside a stream
that is still flowing, the ratios the ones of the figures it printed; bad input is one line and a
non-zero exit."""

from __future__ import annotations

import subprocess
import sys

import pytest
from bench_run import ROOT, run_bench


def test_gil_handover_times_the_big_request_quiet_and_beside_a_flowing_stream() -> None:
    result = run_bench("gil_handover.py", "--rounds", "1", "--messages", "3000")
    assert result["bench"] == "gil_handover" and result["cpu"] != "unknown"
    assert (result["rounds"], result["messages"]) == (1, 3000)
    assert set(result["systems"]) == {"zgtool"}          # no --baseline: this tree alone
    f = result["systems"]["zgtool"]
    assert f["quiet_s"] > 0 and 0 < f["busy_s_min"] <= f["busy_s"] <= f["busy_s_max"]
    assert f["busy_over_quiet"] == pytest.approx(f["busy_s"] / f["quiet_s"], abs=0.006)
    assert f["stream_tokens_per_s_meanwhile"] > 0      # the stream delivered while the big request ran


@pytest.mark.parametrize(("args", "said"), [(("--rounds", "0"), "--rounds must be at least 1"),
                                            (("--messages", "0"), "--messages must be at least 1"),
                                            (("--baseline", "/nonexistent"), "no zgtool/ there")])
def test_gil_handover_refuses_bad_input_in_one_line(args: tuple[str, ...], said: str) -> None:
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "gil_handover.py"), *args],
                          capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert proc.returncode != 0 and proc.stderr.strip().splitlines() == [proc.stderr.strip()] and said in proc.stderr

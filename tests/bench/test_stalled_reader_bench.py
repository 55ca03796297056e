"""bench/stalled_reader.py end to end: a real null server measured quiet and beside a client that stopped
reading a long stream, its blocks freed after each round; the ratio is the one of the figures it printed;
bad input is one line and a non-zero exit."""

from __future__ import annotations

import subprocess
import sys

import pytest
from bench_run import ROOT, run_bench


def test_stalled_reader_measures_the_neighbour_quiet_and_beside_a_stalled_stream() -> None:
    result = run_bench("stalled_reader.py", "--rounds", "1", "--seconds", "0.3")
    assert result["bench"] == "stalled_reader" and result["cpu"] != "unknown"
    assert (result["rounds"], result["seconds"]) == (1, 0.3)
    assert set(result["systems"]) == {"zgtool"}          # no --baseline: this tree alone
    f = result["systems"]["zgtool"]
    assert f["quiet_rps"] > 0 and f["stalled_rps"] > 0 and f["stalled_alone_cpu_pct"] >= 0
    assert f["stalled_over_quiet"] == pytest.approx(f["stalled_rps"] / f["quiet_rps"], abs=0.006)


@pytest.mark.parametrize(("args", "said"), [(("--rounds", "0"), "--rounds must be at least 1"),
                                            (("--seconds", "0"), "--seconds must be more than 0"),
                                            (("--baseline", "/nonexistent"), "no zgtool/ there")])
def test_stalled_reader_refuses_bad_input_in_one_line(args: tuple[str, ...], said: str) -> None:
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "stalled_reader.py"), *args],
                          capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert proc.returncode != 0 and proc.stderr.strip().splitlines() == [proc.stderr.strip()] and said in proc.stderr

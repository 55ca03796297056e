"""bench/serve_startup.py end to end: each system started for real and stopped, the null backend ready
without torch beside a model that loads it, the ratios the ones of the figures it printed; bad input is
one line and a non-zero exit."""

from __future__ import annotations

import subprocess
import sys

import pytest
from bench_run import ROOT, run_bench


def test_serve_startup_starts_each_system_and_the_null_backend_holds_no_torch() -> None:
    result = run_bench("serve_startup.py", "--rounds", "1")
    assert result["bench"] == "serve_startup" and result["rounds"] == 1 and result["cpu"] != "unknown"
    systems = result["systems"]
    assert set(systems) == {"null", "dummy:tiny"}
    assert systems["null"]["torch_loaded"] is False and systems["dummy:tiny"]["torch_loaded"] is True
    for figures in systems.values():
        assert 0 < figures["ready_s_min"] <= figures["ready_s"] <= figures["ready_s_max"] and figures["rss_mb"] > 0
    ratio = result["ready_ratio_to_null"]["dummy:tiny"]
    assert ratio == pytest.approx(systems["dummy:tiny"]["ready_s"] / systems["null"]["ready_s"], abs=0.01)


@pytest.mark.parametrize(("args", "said"), [(("--rounds", "0"), "--rounds must be at least 1"),
                                            (("--baseline", "/nonexistent"), "no zgtool/ there")])
def test_serve_startup_refuses_bad_input_in_one_line(args: tuple[str, ...], said: str) -> None:
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "serve_startup.py"), *args],
                          capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert proc.returncode != 0 and proc.stderr.strip().splitlines() == [proc.stderr.strip()] and said in proc.stderr

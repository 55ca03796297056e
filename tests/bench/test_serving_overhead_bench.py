"""bench/serving_overhead.py end to end (issue 34's serving-floor benchmark): zgtool serve --model null,
the bare uvicorn floor and one nginx hop in front of it, measured in turn through sockets; the last
line is one JSON object with each system's cells, the ratios, the hop's cost and the target checks,
and zgtool's engine's steps per request and mean batch read from its own /metrics. Never a speed."""

from __future__ import annotations

import subprocess
import sys

import pytest
from bench_run import ROOT, run_bench


def test_serving_overhead_measures_zgtool_the_floor_and_one_nginx_hop_and_the_engines_batch() -> None:
    result = run_bench("serving_overhead.py", "--seconds", "0.4", "--slice", "0.2", "--modes", "t1,t16",
                       "--concurrency", "1,4")
    cells = {(c["system"], c["mode"], c["concurrency"]): c for c in result["cells"]}
    assert set(cells) == {(s, m, c) for s in ("zgtool", "floor") for m in ("t1", "t16") for c in (1, 4)} | {
        ("nginx", "t1", 1), ("nginx", "t1", 4)}
    assert all(c["requests"] > 0 and c["errors"] == 0 and c["cpu_us_per_req"] > 0 for c in cells.values())
    for (system, mode, conc), c in cells.items():
        if system != "zgtool":
            assert c["mean_batch"] is None and c["steps_per_req"] is None       # no engine of ours to ask
            continue
        # one step per token, shared: at most one sequence per client in a step
        assert 1.0 <= c["mean_batch"] <= conc
        # steps x sequences per step = sequences computed per request: one per token, give or take
        # the slices' edges (requests in flight when the counters are read)
        tokens = 1 if mode == "t1" else 16
        assert c["steps_per_req"] * c["mean_batch"] == pytest.approx(tokens, rel=0.25), c
    assert result["mean_batch"] == {f"{m}_c{c}": cells[("zgtool", m, c)]["mean_batch"]
                                    for m in ("t1", "t16") for c in (1, 4)}
    assert set(result["ratio_rps"]) == {"t1_c1", "t1_c4", "t16_c1", "t16_c4"}
    assert set(result["nginx_hop_cpu_us_per_req"]) == {"t1_c1", "t1_c4"}
    assert set(result["checks"]) == {"t1_c1_ratio>=0.8", "t16_c1_ratio>=0.6", "t1_c1_extra_cpu<nginx_hop",
                                     "t1_c4_ratio>=0.8", "t16_c4_ratio>=0.6", "t1_c4_extra_cpu<nginx_hop"}
    assert result["meets_targets"] == all(result["checks"].values())


def test_serving_overhead_refuses_an_unknown_mode_in_one_line() -> None:
    p = subprocess.run([sys.executable, str(ROOT / "bench" / "serving_overhead.py"), "--modes", "t1,t99"],
                       capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert p.returncode != 0 and p.stderr.strip() == "--modes: unknown t99; use t1, t16, t16s, front"

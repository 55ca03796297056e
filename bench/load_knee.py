"""Where does p95 double? k6 rate ramp on the null model: direct vs pygw vs nginx->pygw (stack).

    .venv/bin/python bench/load_knee.py [--rates 10,25,50,100,200,400] [--step 3s]

Starts the local stack (null engine, pygw, nginx in front of pygw), ramps each path in
turn through the same rate staircase (open model, ramping-arrival-rate), and prints p95
per rate, the knee (the rate from which p95 stays >= 2x its low-rate value, or requests
fail / cannot be started) and knee ratios. The last line is one JSON object.
On a shared 2-core machine k6 competes with the servers for CPU: read the ratios, not
the absolute rates.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from collections.abc import Iterator
from pathlib import Path

from zgtool.gateway.supervisor import LocalStack, StackConfig
from zgtool.loadtest import RampConfig, find_k6, run_ramp
from zgtool.loadtest.config import parse_duration_s, parse_rates
from zgtool.loadtest.summary import find_knee
from zgtool.targets import Target

PATHS = ("direct", "pygw", "stack")


@contextlib.contextmanager
def null_stack(run_dir: Path) -> Iterator[dict[str, str]]:
    """The null engine, pygw in front of it, and nginx in front of pygw (stack)."""
    with LocalStack(StackConfig(model="null", paths=("pygw", "stack"), run_dir=run_dir)) as st:
        yield dict(st.urls)


def _fmt(v: float | None) -> str:
    return "-" if v is None or v != v else f"{v:.2f}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rates", default="50,100,200,400,800,1200,1600")
    ap.add_argument("--step", default="3s")
    ap.add_argument("--run-dir", type=Path, default=Path("reports") / "load_knee")
    args = ap.parse_args()
    cfg = RampConfig(rates=parse_rates(args.rates), step_s=parse_duration_s(args.step, what="--step"),
                     max_vus=400)
    k6 = find_k6()
    with null_stack(args.run_dir / "stack") as urls:
        targets = {p: Target(p, urls[p]) for p in PATHS}
        result = run_ramp(cfg, targets, k6=k6, run_dir=args.run_dir / "k6", progress=sys.stderr.isatty())

    rates = list(cfg.rates)
    print(f"k6 {result.k6_version} rate ramp on the null model, {cfg.step_s:g} s per step; p95 ms of "
          "http_req_duration (failed requests in brackets)")
    # the 2x knee is what was asked; on a shared machine a 10x "collapse" rate is the sturdier signal
    collapse = {p.name: find_knee(p.steps, 10.0)[0] for p in result.paths}
    print(f"{'path':8}" + "".join(f"{str(r) + '/s':>10}" for r in rates) + f"{'knee 2x':>10}{'collapse 10x':>14}")
    for path in result.paths:
        cells = "".join(f"{_fmt(s.p95_ms) + (f'[{s.failures}]' if s.failures else ''):>10}" for s in path.steps)
        knee = f"{path.knee_rps:g}" if path.knee_rps is not None else f">{rates[-1]}"
        col = f"{collapse[path.name]:g}" if collapse[path.name] is not None else f">{rates[-1]}"
        print(f"{path.name:8}{cells}{knee:>10}{col:>14}")
    for path in result.paths:
        print(f"  {path.name}: {path.knee_reason}")

    knees = {p.name: p.knee_rps for p in result.paths}
    ratios = {}
    for name in ("pygw", "stack"):
        d, g = knees["direct"], knees[name]
        # a knee beyond the last rate is reported as null: the ratio is then only a bound
        ratios[f"{name}_knee_vs_direct"] = round(g / d, 3) if d and g else None
        c_d, c_g = collapse["direct"], collapse[name]
        ratios[f"{name}_collapse_vs_direct"] = round(c_g / c_d, 3) if c_d and c_g else None
    low = {p.name: p.steps[0].p95_ms for p in result.paths}
    ratios.update({f"{n}_low_rate_p95_vs_direct": round(low[n] / low["direct"], 3) for n in ("pygw", "stack")})
    print(json.dumps({
        "bench": "load_knee", "model": "null", "k6": result.k6_version, "rates_rps": rates, "step_s": cfg.step_s,
        "knee_rps": knees, "collapse_10x_rps": collapse, "knee_reason": {p.name: p.knee_reason for p in result.paths},
        "p95_ms_by_rate": {p.name: [round(s.p95_ms, 3) for s in p.steps] for p in result.paths},
        "failures_by_rate": {p.name: [s.failures for s in p.steps] for p in result.paths},
        "ratios": ratios,
    }))


if __name__ == "__main__":
    main()

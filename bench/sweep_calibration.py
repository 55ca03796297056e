"""How many requests per load point does a sweep's knee / capacity-tax statement need? Identical runs, compared.

    .venv/bin/python bench/sweep_calibration.py [--model null] [--loads 1,2,4,8] [--ns 4,8,16,32] [--pairs 4]

Starts `zgtool serve --model MODEL` and pygw in front of it (zgtool.gateway.supervisor.LocalStack), then
for each -n (requests per load point) runs the same closed-loop sweep (`latency-split direct pygw -c LOADS
-n N`, the command's own code: zgtool.latency.schedule.sweep.run_sweep) twice per pair, interleaved, and
compares the two runs' statements: each path's knee and first saturated load, and the capacity tax's bound
and figure. A flip is a pair whose two identical runs state different things. The flip rate per -n (with a
Wilson 95% interval) is what zgtool.latency.analysis.saturation.MIN_POINT_REQUESTS is set from: below it a
sweep's statement is printed as indicative. On a shared 2-core box the figures are noisy: read the trend.
LAST line: JSON.
Measured here (null engine, -c 1,2,4,8, busy 2-core box; pairs that flipped): -n 4: 6/6, 8: 6/6, 16: 5/6,
32: 5/6, 64: 4/6 (--pairs 6); 128: 2/3, 256: 2/3 (--pairs 3). Every pair flipped below 16 per point; above
that, more requests did not make the null engine's knee repeatable here (the box's CPU is its capacity);
dummy:small (--ns 8,32 --pairs 3): 3/3 and 3/3.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

from peerlib.rates import fmt_rate, rate

from zgtool.gateway.supervisor import LocalStack, StackConfig
from zgtool.latency.analysis.saturation import CONCURRENCY, MIN_POINT_REQUESTS
from zgtool.latency.config import SplitConfig
from zgtool.latency.schedule.sweep import SweepResult, SweepSpec, run_sweep
from zgtool.targets import Target


def statement(res: SweepResult) -> tuple[object, ...]:
    """What a sweep states: per path (knee, saturated at), then the tax's bound and its figure (to 10%)."""
    sat = tuple((s.knee, s.saturated_at) for s in (res.saturation[t] for t in res.targets))
    tax = tuple((t.bound, None if t.tax_pct is None else round(t.tax_pct / 10)) for t in res.capacity_tax)
    return sat + tax


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="null")
    ap.add_argument("--loads", default="1,2,4,8")
    ap.add_argument("--ns", default="4,8,16,32")
    ap.add_argument("--pairs", type=int, default=4)
    args = ap.parse_args()
    loads = tuple(float(x) for x in args.loads.split(","))
    ns = [int(x) for x in args.ns.split(",")]
    flips: dict[int, int] = {n: 0 for n in ns}
    said: dict[int, list[str]] = {n: [] for n in ns}
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp, \
            LocalStack(StackConfig(model=args.model, paths=("pygw",), run_dir=Path(tmp))) as st:
        urls = dict(st.urls)
        targets = [Target("direct", urls["direct"]), Target("pygw", urls["pygw"])]
        spec = SweepSpec(CONCURRENCY, loads)
        for pair in range(args.pairs):
            for n in ns:        # interleaved: a slow spell of the box hits every -n alike
                cfg = SplitConfig(num_requests=n, warmup=1, max_tokens=8, seed=pair)
                a, b = (statement(run_sweep(targets, cfg, spec)) for _ in range(2))
                flips[n] += a != b
                said[n].append(f"{a}" if a == b else f"{a} | {b}")
                print(f"pair {pair + 1}/{args.pairs} -n {n}: {'same' if a == b else 'FLIP'}", file=sys.stderr)
    print(f"{args.model}: closed-loop sweep direct vs pygw at -c {args.loads}, {args.pairs} pairs of identical "
          f"runs per -n ({time.monotonic() - t0:.0f} s)")
    print(f"{'-n/point':>9} {'flips':>7}  flip rate [95% CI]")
    rates = {}
    for n in ns:
        r = rate(flips[n], args.pairs)
        rates[n] = r
        print(f"{n:>9} {flips[n]:>3}/{args.pairs:<3}  {fmt_rate(r)}")
    print(f"zgtool calls a statement from fewer than {MIN_POINT_REQUESTS} requests per point indicative")
    print(json.dumps({"bench": "sweep_calibration", "model": args.model, "loads": list(loads),
                      "pairs": args.pairs, "flips": flips, "min_point_requests": MIN_POINT_REQUESTS,
                      "statements": said}))


if __name__ == "__main__":
    main()

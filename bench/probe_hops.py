"""What each hop costs as the probes see it: time to first byte of one small API answer
(the probe's own HTTP/1.1 client, a fresh client connection each time, while nginx keeps
its upstream connections alive, so nginx can beat direct on a loaded machine) on the direct engine and
through nginx, pygw and nginx -> pygw, measured side by side in one run.

    .venv/bin/python bench/probe_hops.py [--n 200] [--model null]

Prints a table, then (last line) one JSON object with the figures and ratios to direct.
"""

from __future__ import annotations

import argparse
import json

from zgtool.gateway.supervisor import LocalStack, StackConfig
from zgtool.probes.headers import probe_headers
from zgtool.stats import summarize
from zgtool.targets import resolve

PATHS = ("direct", "nginx", "pygw", "stack")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=200)
    ap.add_argument("--model", default="null")
    args = ap.parse_args()
    with LocalStack(StackConfig(model=args.model, paths=("nginx", "pygw", "stack"))) as st:
        samples: dict[str, dict[str, list[float]]] = {p: {"connect_ms": [], "ttfb_ms": []} for p in PATHS}
        targets = {p: resolve(st.urls[p]) for p in PATHS}
        for p in PATHS:  # warm-up: first connections, caches, imports
            for _ in range(5):
                probe_headers(targets[p])
        for _ in range(args.n):  # interleaved, so drift hits every path alike
            for p in PATHS:
                r = probe_headers(targets[p])
                samples[p]["connect_ms"].append(r.connect_ms or 0.0)
                samples[p]["ttfb_ms"].append(r.ttfb_ms or 0.0)
    summary = {p: {k: summarize(v) for k, v in s.items()} for p, s in samples.items()}
    base = summary["direct"]["ttfb_ms"]["p50"]
    print(f"{'path':<8} {'ttfb p50':>10} {'ttfb p90':>10} {'connect p50':>12} {'x direct':>9}")
    for p in PATHS:
        t = summary[p]["ttfb_ms"]
        print(f"{p:<8} {t['p50']:>8.3f}ms {t['p90']:>8.3f}ms {summary[p]['connect_ms']['p50']:>10.3f}ms "
              f"{t['p50'] / base:>8.2f}x")
    out = {"bench": "probe_hops", "n": args.n, "model": args.model,
           "ttfb_p50_ms": {p: round(summary[p]["ttfb_ms"]["p50"], 4) for p in PATHS},
           "ttfb_p90_ms": {p: round(summary[p]["ttfb_ms"]["p90"], 4) for p in PATHS},
           "ratio_to_direct_p50": {p: round(summary[p]["ttfb_ms"]["p50"] / base, 3) for p in PATHS}}
    print(json.dumps(out))


if __name__ == "__main__":
    main()

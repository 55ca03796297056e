"""How often do `gate --baseline` and `compare --fail-on-regression` cry wolf on k6 bench results, and how often
do they catch a gateway that got slower?

    .venv/bin/python bench/k6_gate_calibration.py [--model dummy:tiny] [--runs 12] [--rate 20] [--duration 3]
                                                  [--conditions quiet,busy]

One engine (`zgtool serve`) and real hops in front of it (bench/peerlib/delayhop.py, head mode: each request held
a known time before it goes upstream). Each iteration runs three `zgtool bench --scenarios direct,gateway` jobs
(k6, the scenarios one after another) whose gateway is
  A/A    a 0 ms hop,
  A/B2   a 2 ms hop,
  A/B10  a hop holding 10% of the direct path's median duration (measured once, first),
and judges each against the previous iteration's A/A result, as a nightly CI job judges tonight's run against
last night's: `gate --baseline` with the shipped default policy ([regression] method "intervals": the gateway's
tax, its median minus direct's, against the stored run's), the same with method "percentile" (p95 by percentage,
the rule k6 results had before they kept their medians' intervals), and `compare --fail-on-regression`. A/B
results are relabelled with the A/A hop's URL, as if the same gateway had slowed down since the stored run. A
breach of a [regression] row is a false alarm for an A/A pair and a detection for an A/B pair. Under "busy", one
CPU burner per core runs beside it.
Prints a table and, as the LAST line, one JSON object: rates with Wilson 95% intervals.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

from gate_calibration import (
    burners,
    compare_fails,
    relabelled,
    start_engine,
    start_proxy,
    stop_all,
    wait_health,
)
from peerlib.machine import cpu_model
from peerlib.rates import fmt_rate, rate

from zgtool.gate import DEFAULT_POLICY, LoadedResult, evaluate, load_policy

SCENARIOS = ("aa", "ab2ms", "ab10")


def bench(direct: str, gateway: str, rate_rps: int, duration_s: float, out: Path) -> dict:
    cmd = [sys.executable, "-m", "zgtool", "bench", "--direct", direct, "--gateway", gateway, "--scenarios",
           "direct,gateway", "--rate", str(rate_rps), "--duration", f"{duration_s:g}s", "--no-progress", "-o", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env={**os.environ, "NO_COLOR": "1"})
    if proc.returncode != 0 or not out.exists():
        raise SystemExit(f"k6_gate_calibration: bench failed ({proc.returncode}): {proc.stderr[-400:]}")
    return json.loads(out.read_text())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="dummy:tiny")
    ap.add_argument("--runs", type=int, default=12, help="iterations per condition (each: A/A, A/B2, A/B10)")
    ap.add_argument("--rate", type=int, default=20, help="k6 requests/s per scenario")
    ap.add_argument("--duration", type=float, default=3.0, help="seconds per scenario")
    ap.add_argument("--conditions", default="quiet,busy")
    args = ap.parse_args()
    policy = load_policy(str(DEFAULT_POLICY))
    methods = {"gate, intervals": policy,
               "gate, percentile": replace(policy, regression=replace(policy.regression, method="percentile"))}
    engine, direct = start_engine(args.model)
    port = int(direct.rsplit(":", 1)[1])
    procs: list[subprocess.Popen] = [engine]
    summary: dict[str, dict] = {}
    try:
        wait_health(direct, engine)
        with tempfile.TemporaryDirectory() as tmp:
            h0, hop0 = start_proxy(port, 0.0)
            procs.append(h0)
            warm = bench(direct, hop0, args.rate, args.duration, Path(tmp) / "warm.json")
            median_ms = warm["data"]["scenarios"]["direct"]["http_req_duration"]["p50"]
            p2, hop2 = start_proxy(port, 2.0)
            p10, hop10 = start_proxy(port, 0.10 * median_ms)
            procs += [p2, p10]
            hops = {"aa": hop0, "ab2ms": hop2, "ab10": hop10}
            print(f"engine {args.model}: direct median {median_ms:.2f} ms; the 10% hop holds {0.1 * median_ms:.2f} ms",
                  flush=True)
            for cond in [c for c in args.conditions.split(",") if c]:
                burn = burners(os.cpu_count() or 2) if cond == "busy" else []
                load_before = os.getloadavg()[0]
                hits = {m: {s: 0 for s in SCENARIOS} for m in [*methods, "compare"]}
                marked = {s: 0 for s in SCENARIOS}     # "gate, intervals" passes marked inconclusive
                pairs = 0
                stored: LoadedResult | None = None
                try:
                    for i in range(args.runs):
                        for s in SCENARIOS:
                            out = Path(tmp) / f"{cond}-{s}-{i}.json"
                            res = bench(direct, hops[s], args.rate, args.duration, out)
                            if stored is None:
                                continue
                            now = LoadedResult(str(out), relabelled(res, hops[s], hop0))
                            for m, pol in methods.items():
                                rows = [r for r in evaluate(pol, [now], baseline=stored).rows
                                        if r.group == "regression"]
                                own = [r for r in rows if r.status == "fail"]
                                for r in own:
                                    print(f"    {s} {m} FAIL {r.rule}: {r.why}", flush=True)
                                hits[m][s] += bool(own)
                                if pol.regression.method == "intervals":
                                    marked[s] += not own and any(r.inconclusive for r in rows)
                            hits["compare"][s] += compare_fails(Path(stored.label), now.result, Path(tmp))
                        pairs += stored is not None
                        aa = Path(tmp) / f"{cond}-aa-{i}.json"
                        stored = LoadedResult(str(aa), json.loads(aa.read_text()))
                        print(f"  {cond} {i + 1}/{args.runs}: {hits}", flush=True)
                finally:
                    for p in burn:
                        p.kill()
                        p.wait()
                summary[cond] = {"pairs": pairs, "loadavg_1min_before_after": (round(load_before, 2),
                                                                                round(os.getloadavg()[0], 2)),
                                 **{m: {"false_alarm": rate(h["aa"], pairs), "detect_2ms": rate(h["ab2ms"], pairs),
                                        "detect_10pct": rate(h["ab10"], pairs)} for m, h in hits.items()},
                                 # the intervals gate's passes marked inconclusive; a miss left unmarked is silent
                                 "gate, intervals, marks": {
                                     "aa_passes_marked": rate(marked["aa"], max(1, pairs - hits["gate, intervals"]["aa"])),
                                     "silent_miss_2ms": rate(pairs - hits["gate, intervals"]["ab2ms"] - marked["ab2ms"],
                                                             pairs),
                                     "silent_miss_10pct": rate(pairs - hits["gate, intervals"]["ab10"] - marked["ab10"],
                                                               pairs)}}
    finally:
        stop_all(procs)
    print(f"\n{'against the stored run':<34}{'false alarm (A/A)':>34}{'detect 2 ms':>34}{'detect 10%':>34}")
    for cond, r in summary.items():
        for m in [*methods, "compare"]:
            print(f"{cond + ' ' + m:<34}{fmt_rate(r[m]['false_alarm']):>34}{fmt_rate(r[m]['detect_2ms']):>34}"
                  f"{fmt_rate(r[m]['detect_10pct']):>34}")
        mk = r["gate, intervals, marks"]
        print(f"{cond + ' gate, intervals: marked':<34}{'A/A passes ' + fmt_rate(mk['aa_passes_marked']):>34}"
              f"{'silent ' + fmt_rate(mk['silent_miss_2ms']):>34}{'silent ' + fmt_rate(mk['silent_miss_10pct']):>34}")
    print(json.dumps({"bench": "k6_gate_calibration", "model": args.model, "cpu": cpu_model(), "rate_rps": args.rate,
                      "duration_s": args.duration, "conditions": summary}))


if __name__ == "__main__":
    main()

"""Does latency-split keep every figure the wire would keep, and get each right? Checked against tcpdump on lo.

    .venv/bin/python bench/wire_truth.py [--reps 1] [--n1 12] [--n8 24] [--tokens 4] [--no-burn] [--delays 2,10]

`zgtool serve --model dummy:small` behind real hops of bench/peerlib/delayhop.py (head mode: the request held
D ms, so every figure of the answer is late by D): two 0 ms hops (hop0a, hop0b) and one per delay D. With one
CPU burner per core loading the box, each repetition runs, in a shuffled order, {whole answer, stream} x
{c=1, c=8} x {A/A: hop0a against hop0b, tax-D: hop0a against the D ms hop}; each cell is one in-process
latency-split (zgtool.latency.schedule.runner + analysis, the command's own code) while tcpdump captures the
hops' ports. Every request is matched to its packets by its request-id header.

Prints, per configuration: the per-request error against the wire (the client's figure minus the wire's, each
from the request's first byte out: TTFB on whole answers, TTFT on streams, and the total) at p50/p90 over
|error|; the share of figures left out (samples[].unvouched); the stream TTFT tax against the wire's (the
median wire TTFT of the D ms hop minus hop0a's) within 0.5 ms in k of n runs; the A/A runs whose headline
(TTFT on streams, else the total, and the time outside the engine) came out significant. Goals (issue 38):
|error| p50 <= 0.3 ms and p90 <= 0.5 ms, left out <= 5%, tax within 0.5 ms in >= 90% of runs, A/A <= 5%.
The receive clock the run used (the packet clock needs CAP_NET_RAW) is printed with it. LAST line: JSON.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench" / "peerlib"))

from wirelab import burners, start_engine, start_hop, stop_all, tcpdump, wire_requests  # noqa: E402

from zgtool.latency.analysis.phases import analyse  # noqa: E402
from zgtool.latency.config import SplitConfig  # noqa: E402
from zgtool.latency.schedule.runner import measure_targets  # noqa: E402
from zgtool.latency.wire.pktclock import CURRENT  # noqa: E402
from zgtool.targets import Target  # noqa: E402

TAX_TOLERANCE_MS = 0.5
HEADLINE = {True: ("ttft_ms", "outside_engine_ms"), False: ("total_ms", "outside_engine_ms")}


def quantile(xs: list[float], q: float) -> float | None:
    if not xs:
        return None
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * (len(xs) - 1) + 0.5))]


def errors(samples: list[Any], wire: dict[str, Any], stream: bool) -> dict[str, Any]:
    """Per request: client figure minus wire figure, both from the request's first byte out; and what was kept."""
    first = "ttft_ms" if stream else "ttfb_ms"
    out: dict[str, Any] = {"first": [], "total": [], "figures": 0, "left_out": 0, "matched": 0, "wire_first": []}
    for s in samples:
        if not s.ok:
            continue
        for name in (first, "total_ms"):
            out["figures"] += 1
            out["left_out"] += name in s.unvouched
        w = wire.get(s.request_id or "")
        if w is None or w.resp_first is None or s.first_byte_out_ms is None:
            continue
        out["matched"] += 1
        w_first = (w.first_token if stream else w.resp_first)
        if w_first is not None:
            out["wire_first"].append((w_first - w.start) * 1e3)
            fig = getattr(s, first)
            if fig is not None and first not in s.unvouched:
                mine = fig - s.first_byte_out_ms if stream else fig
                out["first"].append(mine - (w_first - w.start) * 1e3)
        if w.resp_last is not None and "total_ms" not in s.unvouched:
            out["total"].append(s.total_ms - s.first_byte_out_ms - (w.resp_last - w.start) * 1e3)
    return out


def run_cell(hops: dict[str, Any], stream: bool, conc: int, scenario: str, n: int, tokens: int, seed: int,
             pcap: Path) -> dict[str, Any]:
    base, cand = ("hop0a", "hop0b") if scenario == "aa" else ("hop0a", scenario)
    targets = [Target(base, hops[base].url, api="openai"), Target(cand, hops[cand].url, api="openai")]
    ports = {t.port for t in targets}
    cfg = SplitConfig(num_requests=n, concurrency=conc, stream=stream, max_tokens=tokens, warmup=2, seed=seed)
    with tcpdump(sorted(ports), pcap, snap=2048):
        samples = measure_targets(targets, cfg)
    res = analyse(targets, samples, cfg)
    wire = wire_requests(pcap, ports)
    errs = [errors(per, wire, stream) for per in samples]
    diffs = {d.phase: d for d in res.differences}
    row: dict[str, Any] = {"stream": stream, "c": conc, "scenario": scenario, "errors": errs,
                           "clocks": sorted({s.rx_clock for per in samples for s in per if s.ok}),
                           "diffs": {k: {"diff_ms": d.diff_ms, "verdict": d.verdict} for k, d in diffs.items()}}
    if stream and scenario != "aa":
        a, b = errs[0]["wire_first"], errs[1]["wire_first"]
        d = diffs.get("ttft_ms")
        if a and b and d is not None and d.diff_ms is not None:
            wire_tax = statistics.median(b) - statistics.median(a)
            row["tax"] = {"client_ms": d.diff_ms, "wire_ms": wire_tax, "ok": abs(d.diff_ms - wire_tax) <= TAX_TOLERANCE_MS}
    if scenario == "aa":
        row["aa_significant"] = any(diffs[m].verdict != "not significant" for m in HEADLINE[stream]
                                    if m in diffs and diffs[m].diff_ms is not None)
    return row


def summarise(rows: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for stream in (False, True):
        for conc in (1, 8):
            rs = [r for r in rows if r["stream"] == stream and r["c"] == conc]
            if not rs:
                continue
            first = [abs(e) for r in rs for t in r["errors"] for e in t["first"]]
            total = [abs(e) for r in rs for t in r["errors"] for e in t["total"]]
            figs = sum(t["figures"] for r in rs for t in r["errors"])
            left = sum(t["left_out"] for r in rs for t in r["errors"])
            out[f"{'stream' if stream else 'body'} c={conc}"] = {
                "first": "ttft" if stream else "ttfb", "matched": sum(t["matched"] for r in rs for t in r["errors"]),
                "first_abs_err_p50_ms": quantile(first, 0.5), "first_abs_err_p90_ms": quantile(first, 0.9),
                "total_abs_err_p50_ms": quantile(total, 0.5), "total_abs_err_p90_ms": quantile(total, 0.9),
                "left_out": left, "figures": figs, "left_out_share": left / figs if figs else None}
    taxes = [r["tax"] for r in rows if "tax" in r]
    aa = [r["aa_significant"] for r in rows if "aa_significant" in r]
    out["stream_ttft_tax"] = {"within_0.5ms": sum(t["ok"] for t in taxes), "runs": len(taxes),
                              "runs_detail": [(round(t["client_ms"], 3), round(t["wire_ms"], 3)) for t in taxes]}
    out["aa"] = {"significant": sum(aa), "runs": len(aa)}
    out["clocks"] = sorted({c for r in rows for c in r["clocks"]})
    return out


def report(s: dict[str, Any]) -> None:
    def f(v: float | None) -> str:
        return "   -  " if v is None else f"{v:6.3f}"

    print(f"receive clock(s) used: {', '.join(s['clocks'])}" + (f" (no packet clock: {CURRENT.why_not})"
                                                                 if CURRENT.why_not else ""))
    print(f"{'config':12s} {'point':5s} {'matched':>7s}  |err| p50   p90 (first)   p50   p90 (total)  left out")
    for key, v in s.items():
        if not key.startswith(("body", "stream ")) or "first" not in v:
            continue
        share = "-" if v["left_out_share"] is None else f"{v['left_out_share']:.1%}"
        print(f"{key:12s} {v['first']:5s} {v['matched']:7d}  {f(v['first_abs_err_p50_ms'])} "
              f"{f(v['first_abs_err_p90_ms'])}        {f(v['total_abs_err_p50_ms'])} {f(v['total_abs_err_p90_ms'])}"
              f"          {v['left_out']} of {v['figures']} ({share})")
    t = s["stream_ttft_tax"]
    print(f"stream TTFT tax within {TAX_TOLERANCE_MS} ms of the wire's: {t['within_0.5ms']} of {t['runs']} runs "
          f"(client, wire ms: {t['runs_detail']})")
    print(f"A/A headline significant: {s['aa']['significant']} of {s['aa']['runs']} runs")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=1)
    ap.add_argument("--n1", type=int, default=12, help="requests per path at c=1")
    ap.add_argument("--n8", type=int, default=24, help="requests per path at c=8")
    ap.add_argument("--tokens", type=int, default=4)
    ap.add_argument("--delays", default="2,10")
    ap.add_argument("--no-burn", action="store_true")
    ap.add_argument("--seed", type=int, default=38)
    args = ap.parse_args()
    if shutil.which("tcpdump") is None:
        raise SystemExit("wire_truth: needs tcpdump (and root) for the reference")
    delays = [float(d) for d in args.delays.split(",") if d]
    procs: list[subprocess.Popen[Any]] = []
    rows: list[dict[str, Any]] = []
    rng = random.Random(args.seed)
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        try:
            engine = start_engine("dummy:small", procs)
            hops = {"hop0a": start_hop(engine, 0.0, "head", Path(tmp), procs),
                    "hop0b": start_hop(engine, 0.0, "head", Path(tmp), procs)}
            for d in delays:
                hops[f"tax-{d:g}"] = start_hop(engine, d, "head", Path(tmp), procs)
            if not args.no_burn:
                burners(procs)
            for rep in range(args.reps):
                cells = [(st, c, sc) for st in (False, True) for c in (1, 8) for sc in ("aa", *(f"tax-{d:g}" for d in delays))]
                rng.shuffle(cells)
                for i, (st, c, sc) in enumerate(cells):
                    row = run_cell(hops, st, c, sc, args.n1 if c == 1 else args.n8, args.tokens,
                                   args.seed + 100 * rep + i, Path(tmp) / "cell.pcap")
                    rows.append(row)
                    print(f"rep {rep} {'stream' if st else 'body'} c={c} {sc}: "
                          + (f"tax {row['tax']['client_ms']:+.3f} vs wire {row['tax']['wire_ms']:+.3f} ms"
                             if "tax" in row else "")
                          + (f"A/A {'SIGNIFICANT' if row.get('aa_significant') else 'not significant'}"
                             if "aa_significant" in row else ""), flush=True)
        finally:
            stop_all(procs)
    s = summarise(rows)
    s["settings"] = {"reps": args.reps, "n1": args.n1, "n8": args.n8, "tokens": args.tokens, "delays_ms": delays,
                     "burn": not args.no_burn, "seconds": round(time.monotonic() - t0)}
    print()
    report(s)
    print(json.dumps(s))


if __name__ == "__main__":
    main()

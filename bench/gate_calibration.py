"""How often does the default CI gate cry wolf, and how often does it catch a real regression?

    .venv/bin/python bench/gate_calibration.py [--model dummy:tiny] [--runs 20] [-n N] [--rounds R]
                                               [--conditions quiet,busy] [--policy FILE]

One engine (`zgtool serve`) and real hops in front of it (bench/peerlib/delayhop.py, head mode: each
request held a known time before it goes upstream, so every figure of the answer is late by exactly
that). The baseline is always a 0 ms hop, so the candidates differ from it by the hold alone. Each
iteration runs three interleaved `zgtool latency-split BASELINE CANDIDATE` jobs with latency-split's
own defaults (streaming, -n 50, automatic rounds; -n/--rounds override) and gates each with the
policy (default: zgtool/default_gates.toml, the shipped default):
  A/A    a 0 ms hop against another 0 ms hop: any failure is a false alarm;
  A/B2   against a 2 ms hop: a failure is a detection;
  A/B10  against a hop holding 10% of the baseline's measured median total: a failure is a detection.
Under "busy", one CPU burner per core runs beside it. For contrast, the way gates used to compare
(two separate runs, p95 by percentage with a 1 ms noise floor) is applied to the A/A data: the
previous iteration's baseline vs this one's candidate.
`gate --baseline FILE` (two separate runs, the nightly CI shape) is calibrated on the same runs: each
iteration's A/A, A/B2 and A/B10 results are gated against the previous iteration's A/A result, by the
policy's [regression] method "intervals" (zgtool/gate/acrossruns.py, the default: these two-path runs are
judged by the hop's paired tax), the same with paths = "always" (each path's own medians judged too) and
"percentile" (p95 by percentage, the old rule); and `zgtool compare STORED THIS --fail-on-regression` on the
same pairs. An A/B result's candidate is relabelled with the A/A candidate's URL, as if the
same gateway had slowed down since the stored run; a breach of a [regression] row (the stored-run comparison's
own, not the run's [paired] rows) is a false alarm for an A/A pair, a detection for an A/B pair.
A pass whose [paired] interval reaches above the allowance is marked inconclusive: counted per scenario, as
the share of A/A passes marked (the mark's cost: how often an honest pass carries it) and the silent miss rate
of each A/B (a regression passed unmarked: the gate sure of itself and wrong); the same for `gate --baseline`
against the stored A/A run before (its [regression] rows' mark).
Prints a table and, as the LAST line, one JSON object: rates with Wilson 95% intervals.
Goals (issue 33): false-alarm rate <= 5%, detection of a 2 ms and of a 10% regression >= 80%.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import replace
from pathlib import Path

from peerlib.rates import wilson
from peerlib.wirelab import stop_all

from zgtool.gate import DEFAULT_POLICY, LoadedResult, evaluate, load_policy
from zgtool.http.net import free_port
from zgtool.stats import percentile

ROOT = Path(__file__).resolve().parents[1]
HOP = ROOT / "bench" / "peerlib" / "delayhop.py"
SCENARIOS = ("aa", "ab2ms", "ab10")


def wait_health(url: str, proc: subprocess.Popen, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"gate_calibration: the engine exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(url + "/health", timeout=1) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.2)
    raise SystemExit(f"gate_calibration: {url} not healthy after {timeout_s} s")


def start_proxy(upstream_port: int, delay_ms: float) -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen([sys.executable, str(HOP), "--upstream", f"127.0.0.1:{upstream_port}",
                             "--delay-ms", f"{delay_ms:.4f}", "--mode", "head"], stdout=subprocess.PIPE, text=True,
                            start_new_session=True)
    assert proc.stdout is not None
    line = proc.stdout.readline().split()
    if len(line) != 2 or line[0] != "PORT":
        raise SystemExit(f"gate_calibration: the delay proxy did not start ({line})")
    return proc, f"http://127.0.0.1:{line[1]}"


def split(a: str, b: str, n: int | None, rounds: int | None, out: Path) -> dict:
    cmd = [sys.executable, "-m", "zgtool", "latency-split", a, b, "--api", "anthropic", "-o", str(out)]
    cmd += ["-n", str(n)] if n else []
    cmd += ["--rounds", str(rounds)] if rounds else []
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env={**os.environ, "NO_COLOR": "1"})
    if proc.returncode not in (0, 1) or not out.exists():
        raise SystemExit(f"gate_calibration: latency-split failed ({proc.returncode}): {proc.stderr[-400:]}")
    return json.loads(out.read_text())


def totals(result: dict, index: int) -> list[float]:
    t = result["data"]["targets"][index]
    return [s["total_ms"] for s in t["samples"] if s.get("ok") and s.get("total_ms") is not None]


def relabelled(result: dict, url: str, as_url: str) -> dict:
    """The result with target `url` named `as_url` everywhere (its samples, phases and differences)."""
    return json.loads(json.dumps(result).replace(json.dumps(url)[1:-1], json.dumps(as_url)[1:-1]))


def compare_fails(stored: Path, now: dict, tmp: Path) -> bool:
    """`zgtool compare STORED NOW --fail-on-regression` would exit 1 (zgtool.compare, in process)."""
    from zgtool.compare.runs import load_runs
    from zgtool.compare.stats import changes

    mine = tmp / "compare-now.json"
    mine.write_text(json.dumps(now))
    return any(c.verdict == "regression" and c.counted for c in changes(load_runs([stored, mine], None)))


def start_engine(model: str) -> tuple[subprocess.Popen, str]:
    """`zgtool serve --model MODEL` on a free port, in its own session; (process, URL), not yet healthy."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "zgtool", "serve", "--model", model, "--port", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    return proc, f"http://127.0.0.1:{port}"


def burners(count: int) -> list[subprocess.Popen]:
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="dummy:tiny")
    ap.add_argument("--runs", type=int, default=20, help="iterations per condition (each: A/A, A/B2, A/B10)")
    ap.add_argument("-n", "--requests", type=int, default=None, help="default: latency-split's own (50)")
    ap.add_argument("--rounds", type=int, default=None, help="default: latency-split's automatic rounds")
    ap.add_argument("--conditions", default="quiet,busy")
    ap.add_argument("--policy", default=str(DEFAULT_POLICY))
    args = ap.parse_args()
    policy = load_policy(args.policy)
    across = {"intervals": policy,       # the shipped default: the hops' taxes (each path's medians: one-path runs)
              "intervals, paths always": replace(policy, regression=replace(policy.regression, paths="always")),
              "percentile": replace(policy, regression=replace(policy.regression, method="percentile"))}
    engine, direct = start_engine(args.model)
    port = int(direct.rsplit(":", 1)[1])
    procs: list[subprocess.Popen] = [engine]
    summary: dict[str, dict] = {}
    try:
        wait_health(direct, engine)
        with tempfile.TemporaryDirectory() as tmp:
            h0, base = start_proxy(port, 0.0)
            h0b, base_b = start_proxy(port, 0.0)
            procs += [h0, h0b]
            warm = split(base, base_b, args.requests, args.rounds, Path(tmp) / "warm.json")
            median_ms = percentile(totals(warm, 0), 50)
            p10, url10 = start_proxy(port, 0.10 * median_ms)
            p2, url2 = start_proxy(port, 2.0)
            procs += [p10, p2]
            targets = {"aa": base_b, "ab10": url10, "ab2ms": url2}
            print(f"engine {args.model} behind a 0 ms hop: median total {median_ms:.2f} ms; the 10% hop holds "
                  f"{0.1 * median_ms:.2f} ms")
            for cond in [c for c in args.conditions.split(",") if c]:
                burn = burners(os.cpu_count() or 2) if cond == "busy" else []
                load_before = os.getloadavg()[0]
                fails = {s: 0 for s in SCENARIOS}
                unreliable = {s: 0 for s in SCENARIOS}
                marked = {s: 0 for s in SCENARIOS}      # passes the paired rows marked inconclusive
                failed_by: dict[str, dict[str, int]] = {s: {} for s in SCENARIOS}
                effect_ms: dict[str, list[float]] = {s: [] for s in SCENARIOS}
                naive_fa = naive_n = 0
                prev_base_p95: float | None = None
                prev_aa: LoadedResult | None = None
                vs_stored = {m: {s: 0 for s in SCENARIOS} for m in [*across, "compare"]}
                vs_marked = {m: {s: 0 for s in SCENARIOS} for m, pol in across.items()   # passes against it marked
                             if pol.regression.method == "intervals"}                      # inconclusive
                stored_n = 0
                try:
                    for i in range(args.runs):
                        for s in SCENARIOS:
                            out = Path(tmp) / f"{cond}-{s}-{i}.json"
                            res = split(base, targets[s], args.requests, args.rounds, out)
                            report = evaluate(policy, [LoadedResult(str(out), res)])
                            if prev_aa is not None:       # gate --baseline: against the stored A/A run before
                                now = LoadedResult(str(out), relabelled(res, targets[s], base_b))
                                for m, pol in across.items():     # its own rows only, not the run's [paired]
                                    rows = [r for r in evaluate(pol, [now], baseline=prev_aa).rows
                                            if r.group == "regression"]
                                    own = [r for r in rows if r.status == "fail"]
                                    vs_stored[m][s] += bool(own)
                                    if m in vs_marked:
                                        vs_marked[m][s] += not own and any(r.inconclusive for r in rows)
                                vs_stored["compare"][s] += compare_fails(Path(prev_aa.label), now.result, Path(tmp))
                            fails[s] += report.verdict == "fail"
                            for row in report.breaches:    # which check fired, and why, in words
                                why = f"{row.rule}: {row.why}"
                                print(f"    {s} FAIL {why}", flush=True)
                                failed_by[s][row.rule] = failed_by[s].get(row.rule, 0) + 1
                            unreliable[s] += report.verdict == "unreliable"
                            marked[s] += report.verdict == "pass" and any(
                                r.inconclusive for r in report.rows if r.group == "paired")
                            a, b = totals(res, 0), totals(res, 1)
                            effect_ms[s].append(percentile(b, 50) - percentile(a, 50))
                            if s == "aa":
                                cand_p95 = percentile(b, 95)
                                if prev_base_p95 is not None:
                                    naive_n += 1
                                    naive_fa += (cand_p95 > prev_base_p95 * 1.10 and cand_p95 - prev_base_p95 > 1.0)
                                prev_base_p95 = percentile(a, 95)
                        stored_n += prev_aa is not None
                        stored = Path(tmp) / f"{cond}-aa-{i}.json"
                        prev_aa = LoadedResult(str(stored), json.loads(stored.read_text()))
                        print(f"  {cond} {i + 1}/{args.runs}: fails {fails}; against the stored run {vs_stored}",
                              flush=True)
                finally:
                    for p in burn:
                        p.kill()
                        p.wait()
                n = args.runs
                summary[cond] = {
                    "runs_per_scenario": n,
                    "loadavg_1min_before_after": (round(load_before, 2), round(os.getloadavg()[0], 2)),
                    "false_alarm_rate": fails["aa"] / n, "false_alarm_ci95": wilson(fails["aa"], n),
                    "detection_rate_10pct": fails["ab10"] / n, "detection_10pct_ci95": wilson(fails["ab10"], n),
                    "detection_rate_2ms": fails["ab2ms"] / n, "detection_2ms_ci95": wilson(fails["ab2ms"], n),
                    "unreliable_runs": unreliable, "failed_checks": failed_by,
                    # a pass marked inconclusive: its interval reached above the allowance. For an A/B pair
                    # a miss left unmarked is a silent one (the gate passed, sure of itself, over a regression)
                    "passes_marked_inconclusive": marked,
                    "aa_passes_marked_rate": marked["aa"] / max(1, n - fails["aa"] - unreliable["aa"]),
                    "silent_miss_rate_10pct": (n - fails["ab10"] - unreliable["ab10"] - marked["ab10"]) / n,
                    "silent_miss_10pct_ci95": wilson(n - fails["ab10"] - unreliable["ab10"] - marked["ab10"], n),
                    "silent_miss_rate_2ms": (n - fails["ab2ms"] - unreliable["ab2ms"] - marked["ab2ms"]) / n,
                    "median_effect_ms": {s: round(percentile(v, 50), 3) for s, v in effect_ms.items() if v},
                    "separate_runs_p95_10pct_false_alarm_rate": naive_fa / naive_n if naive_n else None,
                    "separate_runs_comparisons": naive_n,
                    "gate_baseline": {m: {"pairs": stored_n,
                                          "false_alarm_rate": v["aa"] / stored_n if stored_n else None,
                                          "false_alarm_ci95": wilson(v["aa"], stored_n) if stored_n else None,
                                          "detection_rate_2ms": v["ab2ms"] / stored_n if stored_n else None,
                                          "detection_rate_10pct": v["ab10"] / stored_n if stored_n else None,
                                          # passes marked inconclusive, and misses left unmarked (silent)
                                          **({"passes_marked_inconclusive": vs_marked[m],
                                              "aa_passes_marked_rate": vs_marked[m]["aa"] / max(1, stored_n - v["aa"]),
                                              "silent_miss_rate_2ms": (stored_n - v["ab2ms"] - vs_marked[m]["ab2ms"])
                                              / stored_n if stored_n else None,
                                              "silent_miss_rate_10pct": (stored_n - v["ab10"] - vs_marked[m]["ab10"])
                                              / stored_n if stored_n else None} if m in vs_marked else {})}
                                      for m, v in vs_stored.items()},
                }
    finally:
        stop_all(procs)
    print(f"\n{'condition':<10}{'false alarm (A/A)':>22}{'detect 2 ms':>16}{'detect 10%':>16}{'old way FA':>14}"
          f"{'A/A marked':>12}{'silent miss 10%':>17}")
    for cond, r in summary.items():
        old = r["separate_runs_p95_10pct_false_alarm_rate"]
        print(f"{cond:<10}{r['false_alarm_rate']:>21.0%} {r['detection_rate_2ms']:>15.0%} "
              f"{r['detection_rate_10pct']:>15.0%} {'-' if old is None else f'{old:.0%}':>13} "
              f"{r['aa_passes_marked_rate']:>11.0%} {r['silent_miss_rate_10pct']:>16.0%}")
    print(f"\n{'--baseline (two runs)':<32}{'false alarm (A/A)':>18}{'detect 2 ms':>13}{'detect 10%':>12}"
          f"{'A/A marked':>12}{'silent miss 2 ms':>18}")
    for cond, r in summary.items():
        for m, g in r["gate_baseline"].items():
            if g["pairs"]:
                marks = (f"{g['aa_passes_marked_rate']:>11.0%} {g['silent_miss_rate_2ms']:>17.0%}"
                         if "aa_passes_marked_rate" in g else f"{'-':>11} {'-':>17}")
                print(f"{cond + ' ' + m:<32}{g['false_alarm_rate']:>17.0%} {g['detection_rate_2ms']:>12.0%} "
                      f"{g['detection_rate_10pct']:>11.0%} {marks}")
    met = all(r["false_alarm_rate"] <= 0.05 and r["detection_rate_10pct"] >= 0.80 and r["detection_rate_2ms"] >= 0.80
              for r in summary.values())
    print(json.dumps({"bench": "gate_calibration", "model": args.model, "policy": args.policy,
                      "requests": args.requests or "latency-split default", "rounds": args.rounds or "auto",
                      "conditions": summary,
                      "goals": {"false_alarm_max": 0.05, "detection_2ms_min": 0.80, "detection_10pct_min": 0.80},
                      "goals_met": met}))


if __name__ == "__main__":
    main()

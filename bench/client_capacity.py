"""Benchmark: the highest request rate zgtool's open-loop latency client sustains on one core, next to k6.

Starts `zgtool serve --model null` (pinned to one CPU when there are two or more), then steps a
constant arrival rate up (doubling, then bisecting between the last rate kept and the first missed)
for each load generator, pinned with `taskset` to another single CPU:

- zgtool: the latency-split client (zgtool.latency.schedule.runner.measure_targets with --rate R --arrivals
  constant, one block), non-stream, the short prompt (16 tokens). A rate is sustained when the
  dispatch lag p99 (actual send - due time) is under 1 ms, the achieved send rate is within 5% of
  the schedule (zgtool.latency.analysis.openloop), no request waited for a worker, and none failed.
- zgtool~: the same client judged by k6's kind of rule (no lag rule), for a like-for-like ratio.
- k6: a constant-arrival-rate scenario, same body and target. k6 reports no dispatch lag, so its
  criterion is its own scheduling: dropped_iterations == 0, iterations >= 95% of rate x duration,
  and no failed request (http_req_failed). Its http_req_blocked p99 is printed beside it.
- AIPerf / GuideLLM: measured only if installed in their own environment (never installed here).

Both generators share one machine with the engine; when both stop at about the same rate, the
engine (not the client) is the limit, and the output says so.

    .venv/bin/python bench/client_capacity.py [--step-s 3] [--start-rps 25] [--max-rps 6400]

The LAST line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "support"))
from engine_live import child  # noqa: E402  (the live-engine fixture the tests use)

from zgtool.errors import MissingCapability  # noqa: E402

LAG_P99_LIMIT_MS = 1.0
BISECT_STEPS = 3
MAX_IN_FLIGHT = 256         # zgtool's default pool bound; k6 gets the same maxVUs

K6_SCRIPT = """
import http from 'k6/http';
export const options = {
  discardResponseBodies: true,
  summaryTrendStats: ['avg', 'min', 'med', 'max', 'p(90)', 'p(95)', 'p(99)'],
  scenarios: { capacity: { executor: 'constant-arrival-rate', rate: Number(__ENV.RATE), timeUnit: '1s',
    duration: __ENV.DURATION, preAllocatedVUs: Number(__ENV.PREALLOC), maxVUs: Number(__ENV.MAXVUS) } },
};
const body = open(__ENV.BODY);
const params = { headers: { 'content-type': 'application/json', 'anthropic-version': '2023-06-01' } };
export default function () { http.post(__ENV.URL, body, params); }
export function handleSummary(data) { return { [__ENV.OUT]: JSON.stringify(data) }; }
"""


@dataclass
class Step:
    rate_rps: float
    kept: bool
    achieved_rps: float | None
    detail: str


def cpus() -> list[int]:
    return sorted(os.sched_getaffinity(0))


def pin(cpu: int | None) -> list[str]:
    return ["taskset", "-c", str(cpu)] if cpu is not None and shutil.which("taskset") else []


# --- zgtool: one step in a pinned child process ---------------------------------------------------------

def zgtool_child(url: str, rate: float, n: int) -> None:
    """Runs inside the pinned child: one open-loop block, prints the summary as JSON."""
    from dataclasses import asdict

    from zgtool.latency.analysis.openloop import summarize_open_loop
    from zgtool.latency.config import SplitConfig
    from zgtool.latency.schedule.openloop import OpenLoopLog
    from zgtool.latency.schedule.runner import measure_targets
    from zgtool.targets import Target

    cfg = SplitConfig(num_requests=n, warmup=5, stream=False, rate_rps=rate, arrivals="constant", rounds=1,
                      max_in_flight=MAX_IN_FLIGHT)
    log = OpenLoopLog()
    (samples,) = measure_targets([Target("engine", url)], cfg, open_loop=log)
    o = summarize_open_loop(samples, cfg, log.records["engine"])
    print(json.dumps({**asdict(o), "errors": sum(1 for s in samples if not s.ok)}))


def zgtool_step(url: str, rate: float, step_s: float, cpu: int | None, lag_rule: bool = True) -> Step:
    """One rate; kept by the lag rule (p99 < LAG_P99_LIMIT_MS) and, with or without it, k6's own kind of
    rule: sent >= 95% of the schedule, nothing waited for a worker (k6: dropped), nothing failed."""
    n = max(20, round(rate * step_s))
    r = subprocess.run([*pin(cpu), sys.executable, __file__, "--child", url, str(rate), str(n)],
                       capture_output=True, text=True, timeout=120 + 2 * step_s)
    if r.returncode != 0:
        return Step(rate, False, None, f"client failed: {r.stderr.strip().splitlines()[-1:]}")
    o = json.loads(r.stdout.strip().splitlines()[-1])
    lag = o["dispatch_lag_p99_ms"]
    why = []
    if lag_rule and (lag is None or lag >= LAG_P99_LIMIT_MS):
        why.append(f"lag p99 {lag:.2f} ms")
    if o["achieved_rate_rps"] is None or o["achieved_rate_rps"] < 0.95 * o["scheduled_rate_rps"]:
        why.append(f"sent {o['achieved_rate_rps']:.0f} of {o['scheduled_rate_rps']:.0f} req/s")
    if o["waited_for_worker"]:
        why.append(f"{o['waited_for_worker']} waited for a worker")
    if o["errors"]:
        why.append(f"{o['errors']} failed")
    detail = (f"lag p50 {o['dispatch_lag_p50_ms']:.3f} p99 {lag:.3f} ms, {o['workers_max']} workers, "
              f"client CPU {o['client_cpu_share']:.0%}" + (f"; missed: {', '.join(why)}" if why else ""))
    return Step(rate, not why, o["achieved_rate_rps"], detail)


# --- k6 --------------------------------------------------------------------------------------------------

def k6_step(k6: Path, url: str, rate: float, step_s: float, cpu: int | None, work: Path) -> Step:
    out = work / f"k6-{rate:g}.json"
    env = {**os.environ, "RATE": str(int(round(rate))), "DURATION": f"{step_s:g}s", "URL": url + "/v1/messages",
           "BODY": str(work / "body.json"), "OUT": str(out), "PREALLOC": str(min(MAX_IN_FLIGHT, 16)),
           "MAXVUS": str(MAX_IN_FLIGHT), "K6_NO_USAGE_REPORT": "true"}
    r = subprocess.run([*pin(cpu), str(k6), "run", "--quiet", "--no-color", str(work / "capacity.js")],
                       capture_output=True, text=True, timeout=120 + 2 * step_s, env=env)
    if not out.is_file():
        return Step(rate, False, None, f"k6 exited {r.returncode}: {r.stderr.strip().splitlines()[-1:]}")
    m = json.loads(out.read_text())["metrics"]

    def val(name: str, key: str, default: float = 0.0) -> float:
        return float((m.get(name) or {}).get("values", {}).get(key, default))

    iters, dropped = val("iterations", "count"), val("dropped_iterations", "count")
    failed = val("http_req_failed", "passes")          # a Rate metric: passes = failed requests
    achieved = val("iterations", "rate")
    why = []
    if dropped:
        why.append(f"{dropped:.0f} dropped")
    if iters < 0.95 * round(rate) * step_s:
        why.append(f"{iters:.0f} of {round(rate) * step_s:.0f} iterations")
    if failed:
        why.append(f"{failed:.0f} failed")
    detail = (f"{iters:.0f} iterations, {dropped:.0f} dropped, vus_max {val('vus_max', 'value'):.0f}, "
              f"http_req_blocked p99 {val('http_req_blocked', 'p(99)', float('nan')):.3f} ms, http_req_duration "
              f"p50 {val('http_req_duration', 'med', float('nan')):.3f} ms" + (f"; missed: {', '.join(why)}" if why else ""))
    return Step(rate, not why, achieved, detail)


# --- stepping ---------------------------------------------------------------------------------------------

@dataclass
class Search:
    rate: float
    good: float | None = None
    bad: float | None = None
    bisects: int = 0
    done: bool = False
    steps: list[Step] = field(default_factory=list)

    def advance(self, rate: float, kept: bool, ceiling: float) -> None:
        """Double until a miss, then bisect between the highest rate kept and the lowest missed."""
        if kept:
            self.good = rate
        else:
            self.bad = rate
        if self.bad is None:
            self.rate, self.done = rate * 2, rate * 2 > ceiling
        elif self.good is None or self.bisects >= BISECT_STEPS:
            self.done = True
        else:
            mid = float(round((self.good + self.bad) / 2))
            self.rate, self.bisects, self.done = mid, self.bisects + 1, mid in (self.good, self.bad)


def find_capacities(generators: dict[str, Callable[[float], Step]], start: float, ceiling: float,
                    ) -> dict[str, Search]:
    """Per generator, the highest rate kept. The generators take turns at each step (the order alternating),
    so the machine's other load lands on both alike; a missed rate is tried once more before it counts
    (one noisy second is not a limit)."""
    state = {name: Search(start) for name in generators}

    def attempt(name: str, rate: float) -> bool:
        for _try in range(2):
            s = generators[name](rate)
            state[name].steps.append(s)
            print(f"  {name:<7} {rate:8.0f} req/s  {'kept  ' if s.kept else 'MISSED'}  {s.detail}", flush=True)
            if s.kept:
                return True
        return False

    order = list(generators)
    while not all(st.done for st in state.values()):
        for name in order:
            st = state[name]
            if not st.done:
                st.advance(st.rate, attempt(name, st.rate), ceiling)
        order.reverse()
    return state


def other_tools() -> dict[str, str]:
    """AIPerf / GuideLLM: found only as their own commands (installed in their own environment)."""
    found = {}
    for name in ("aiperf", "guidellm"):
        path = shutil.which(name)
        found[name] = path if path else "not installed"
    return found


def main() -> None:
    if len(sys.argv) == 5 and sys.argv[1] == "--child":
        zgtool_child(sys.argv[2], float(sys.argv[3]), int(sys.argv[4]))
        return
    ap = argparse.ArgumentParser()
    ap.add_argument("--step-s", type=float, default=3.0, help="seconds per rate step")
    ap.add_argument("--start-rps", type=float, default=25.0)
    ap.add_argument("--max-rps", type=float, default=6400.0)
    args = ap.parse_args()

    from zgtool.latency.config import SplitConfig
    from zgtool.latency.wire.client import request_body
    from zgtool.loadtest.k6bin import find_k6, k6_version
    from zgtool.targets import Target

    avail = cpus()
    load_before = os.getloadavg()[0]
    engine_cpu = avail[0] if len(avail) >= 2 else None
    client_cpu = avail[-1] if avail else None
    shared = len(avail) < 2
    print(f"CPUs {avail}: engine on {engine_cpu if engine_cpu is not None else 'any'}, each client pinned to "
          f"{client_cpu}{' (shared with the engine)' if shared else ''}; taskset "
          f"{'yes' if shutil.which('taskset') else 'not found: unpinned'}; load {load_before:.2f}")
    with tempfile.TemporaryDirectory() as tmp, \
            child(Path(tmp), keyed=False, prefix=tuple(pin(engine_cpu)), health_timeout_s=90) as engine:
        url = engine.url
        work = Path(tmp)
        (work / "capacity.js").write_text(K6_SCRIPT)
        (work / "body.json").write_bytes(request_body(Target("engine", url), SplitConfig(stream=False)))
        generators: dict[str, Callable[[float], Step]] = {
            "zgtool": lambda r: zgtool_step(url, r, args.step_s, client_cpu),
            "zgtool~": lambda r: zgtool_step(url, r, args.step_s, client_cpu, lag_rule=False)}
        print(f"zgtool: the latency-split client (--rate, constant arrivals); kept = dispatch lag p99 < "
              f"{LAG_P99_LIMIT_MS:g} ms, sent >= 95% of the schedule, nothing waited for a worker or failed")
        print("zgtool~: the same client judged like k6 (no lag rule: sent >= 95% of the schedule, nothing "
              "waited for a worker, nothing failed)")
        try:
            k6 = find_k6()
            k6v = k6_version(k6)
            generators["k6"] = lambda r: k6_step(k6, url, r, args.step_s, client_cpu, work)
            print(f"k6 {k6v}: constant-arrival-rate, maxVUs {MAX_IN_FLIGHT}; kept = dropped_iterations == 0, "
                  f"iterations >= 95% of rate x duration, no failed request (k6's own scheduling: it reports "
                  f"no dispatch lag)")
        except MissingCapability as exc:
            k6v = f"unavailable: {exc}"
            print(f"k6: {k6v}")
        found = find_capacities(generators, args.start_rps, args.max_rps)
        zg_rate, zg_steps = found["zgtool"].good, found["zgtool"].steps
        zgk_rate, zgk_steps = found["zgtool~"].good, found["zgtool~"].steps
        k6_rate, k6_steps = (found["k6"].good, found["k6"].steps) if "k6" in found else (None, [])
    others = other_tools()
    for name, where in others.items():
        print(f"{name}: {where}")
    ratio = zgk_rate / k6_rate if zgk_rate and k6_rate else None
    load_after = os.getloadavg()[0]
    print(f"{'generator':<10} {'criterion':<44} {'max kept req/s':>15}")
    print(f"{'zgtool':<10} {f'dispatch lag p99 < {LAG_P99_LIMIT_MS:g} ms + as k6':<44} "
          f"{zg_rate if zg_rate is not None else '-':>15}")
    print(f"{'zgtool':<10} {'as k6: on schedule, none waited or failed':<44} "
          f"{zgk_rate if zgk_rate is not None else '-':>15}")
    print(f"{'k6':<10} {'dropped_iterations == 0, none failed':<44} {k6_rate if k6_rate is not None else '-':>15}")
    if ratio is not None:
        print(f"zgtool / k6 (same kind of criterion) = {ratio:.2f}")
    capped = [n for n, st in found.items() if st.good is not None and st.bad is None]
    if capped:
        print(f"note: {', '.join(capped)} kept every rate up to the ceiling --max-rps {args.max_rps:g}")
    if ratio is not None and 0.8 <= ratio <= 1.25 and not capped:
        print("note: both stop near the same rate: the engine (same machine) may be the limit, not the clients")
    print(f"machine load (1 min) {load_before:.2f} before, {load_after:.2f} after: on a busy box every figure is low")
    print(json.dumps({
        "bench": "client_capacity", "step_s": args.step_s, "cpus": avail, "shared_cpu": shared,
        "load_before": round(load_before, 2), "load_after": round(load_after, 2),
        "lag_p99_limit_ms": LAG_P99_LIMIT_MS, "zgtool_max_rps": zg_rate, "zgtool_k6_criterion_max_rps": zgk_rate,
        "k6_max_rps": k6_rate, "zgtool_over_k6": round(ratio, 3) if ratio is not None else None, "k6_version": k6v,
        "zgtool_steps": [s.__dict__ for s in zg_steps], "zgtool_k6_criterion_steps": [s.__dict__ for s in zgk_steps],
        "k6_steps": [s.__dict__ for s in k6_steps], "aiperf": others["aiperf"], "guidellm": others["guidellm"],
    }))

if __name__ == "__main__":
    main()

"""Where the open-loop client's dispatch lag comes from: each send's lateness split into its steps.

    .venv/bin/python bench/dispatch_lag.py [--rates 25,50,100,200] [-n 400] [--url URL]

Starts `zgtool serve --model null` (pinned to CPU 0 when there are two or more; or uses --url), then runs
zgtool's open-loop client (zgtool.latency.schedule.runner.measure_targets, --rate R --arrivals
constant, non-stream) pinned to one other CPU, in a fresh interpreter per run, with each send timed at
three points:
  wake      the dispatcher thread woke from its sleep, minus the send's due time (the OS's wake-up:
            timer slack, and the run queue when the core is shared);
  hand-off  the worker thread started the request, minus the due time (wake + the queue hand-off:
            a futex wake of the worker and the GIL);
  lag       the request's recorded start (what `dispatch_lag_ms` reports).
and every garbage collection's pause. Two systems side by side per rate: the client as shipped, and the
same client with the garbage collector disabled (does GC make the tail?). Ratios are printed; the LAST
line is one JSON object.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from time import perf_counter_ns
from typing import Any


def _p(values: list[float], q: float) -> float:
    v = sorted(values)
    return v[min(len(v) - 1, int(q * len(v)))] if v else float("nan")


def child(url: str, rate: float, n: int, no_gc: bool) -> None:
    """One run, instrumented; prints one JSON line."""
    from zgtool.latency.config import SplitConfig
    from zgtool.latency.schedule import openloop as ol
    from zgtool.latency.schedule.runner import measure_targets
    from zgtool.latency.wire import client as wire
    from zgtool.targets import resolve

    due: dict[int, int] = {}
    wake: list[float] = []
    handoff: list[float] = []
    submit, measure = ol.WorkerPool.submit, wire.Session.measure

    def timed_submit(self: Any, index: int, rnd: int, due_ns: int, out: list[Any]) -> bool:
        wake.append((perf_counter_ns() - due_ns) / 1e6)
        due[index] = due_ns
        return submit(self, index, rnd, due_ns, out)

    def timed_measure(self: Any, index: int, worker: int, rnd: int, t0: int) -> Any:
        if index in due and rnd >= 0:
            handoff.append((perf_counter_ns() - due[index]) / 1e6)
        return measure(self, index, worker, rnd, t0)

    ol.WorkerPool.submit = timed_submit  # type: ignore[method-assign]
    wire.Session.measure = timed_measure  # type: ignore[method-assign]
    pauses: list[float] = []
    started = [0]

    def on_gc(phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            started[0] = perf_counter_ns()
        else:
            pauses.append((perf_counter_ns() - started[0]) / 1e6)

    gc.callbacks.append(on_gc)
    if no_gc:
        gc.disable()
    target = resolve(url, None, api="anthropic", model="null")
    cfg = SplitConfig(num_requests=n, concurrency=1, warmup=2, stream=False, rate_rps=rate, arrivals="constant",
                      rounds=1)
    samples = measure_targets([target], cfg)[0]
    lag = [s.dispatch_lag_ms for s in samples if s.dispatch_lag_ms is not None]
    print(json.dumps({"rate": rate, "gc": not no_gc, "n": len(lag),
                      "lag_p50_ms": _p(lag, 0.5), "lag_p99_ms": _p(lag, 0.99),
                      "wake_p50_ms": _p(wake, 0.5), "wake_p99_ms": _p(wake, 0.99),
                      "handoff_p50_ms": _p(handoff, 0.5), "handoff_p99_ms": _p(handoff, 0.99),
                      "gc_pauses": len(pauses), "gc_max_ms": max(pauses, default=0.0)}))


def _pin(cpu: int | None) -> list[str]:
    return ["taskset", "-c", str(cpu)] if cpu is not None and shutil.which("taskset") else []


def _engine(cpu: int | None, workdir: Path) -> tuple[subprocess.Popen[bytes], str]:
    import socket

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    log = (workdir / "serve.log").open("wb")
    proc = subprocess.Popen([*_pin(cpu), sys.executable, "-m", "zgtool", "serve", "--model", "null", "--port",
                             str(port)], stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url + "/health", timeout=1) as r:
                if r.status == 200:
                    return proc, url
        except OSError:
            time.sleep(0.2)
    proc.kill()
    raise SystemExit("dispatch_lag: the null engine did not start")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rates", default="25,50,100,200")
    ap.add_argument("-n", "--requests", type=int, default=400)
    ap.add_argument("--url", default=None, help="an engine already running (default: start a null engine)")
    ap.add_argument("--child", nargs=3, metavar=("URL", "RATE", "NO_GC"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args.child[0], float(args.child[1]), args.requests, args.child[2] == "1")
        return
    ncpu = os.cpu_count() or 1
    engine_cpu, client_cpu = (0, 1) if ncpu >= 2 else (None, None)
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        proc, url = (None, args.url) if args.url else _engine(engine_cpu, Path(tmp))
        try:
            load0 = os.getloadavg()[0]
            for rate in [float(r) for r in args.rates.split(",") if r]:
                for no_gc in (False, True):    # alternate: both see the same drift of a shared box
                    out = subprocess.run([*_pin(client_cpu), sys.executable, __file__, "-n", str(args.requests),
                                          "--child", url, str(rate), "1" if no_gc else "0"],
                                         capture_output=True, text=True, timeout=600)
                    if out.returncode != 0:
                        raise SystemExit(f"dispatch_lag: the client run failed: {out.stderr[-400:]}")
                    rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
        finally:
            if proc is not None:
                proc.terminate()
                proc.wait(timeout=15)
    print(f"{'rate':>6} {'gc':>4} {'lag p50':>8} {'lag p99':>8} {'wake p99':>9} {'handoff p99':>12} {'gc max':>7}"
          f" {'wake/lag p99':>13}")
    for r in rows:
        share = r["wake_p99_ms"] / r["lag_p99_ms"] if r["lag_p99_ms"] else float("nan")
        print(f"{r['rate']:>6g} {'on' if r['gc'] else 'off':>4} {r['lag_p50_ms']:>8.3f} {r['lag_p99_ms']:>8.3f} "
              f"{r['wake_p99_ms']:>9.3f} {r['handoff_p99_ms']:>12.3f} {r['gc_max_ms']:>7.3f} {share:>13.2f}")
    by_rate: dict[float, dict[bool, dict[str, Any]]] = {}
    for r in rows:
        by_rate.setdefault(r["rate"], {})[r["gc"]] = r
    ratios = {f"{rate:g}": round(v[True]["lag_p99_ms"] / v[False]["lag_p99_ms"], 2)
              for rate, v in by_rate.items() if v.get(False) and v[False]["lag_p99_ms"]}
    print("lag p99, gc on / gc off: " + ", ".join(f"{k} req/s {v}x" for k, v in ratios.items()))
    print(json.dumps({"bench": "dispatch_lag", "cpus": ncpu, "loadavg_1min_before": round(load0, 2),
                      "loadavg_1min_after": round(os.getloadavg()[0], 2), "requests": args.requests, "rows": rows,
                      "lag_p99_gc_on_over_off": ratios}))


if __name__ == "__main__":
    main()

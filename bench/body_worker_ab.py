"""What the body worker process buys: large bodies decoded in the worker vs in the server's own
large-body thread, side by side on one in-process server (the null model), rounds alternated.

    .venv/bin/python bench/body_worker_ab.py [--rounds 6] [--body-bytes 7000000] [--hostile 4]

Per round a separate process sends ``--hostile`` over-context prompts of ``--body-bytes`` at once
(each answered 400 after its decode); inside the server a thread wakes every 2 ms and records how
late it wakes (the longest wait for the GIL and a core: what /health and every stream wait too).
Modes: ``worker`` (as served: bodies over intake.PROCESS_BODY_BYTES go to the body worker),
``thread`` (that threshold raised past the body: decoded in the server's large-body thread, as
before the worker) and ``quiet`` (the same requests with 1 KB prompts: the box's own wake-up lag).
Printed per mode: the median over rounds of each round's longest and p99 wake-up lag, and the
server process's CPU per hostile request; ratios worker/thread; the last line is one JSON object.
On a shared CPU the lags are mostly the scheduler's: read them against ``quiet`` in the same run.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "support"))
from engine_live import serving  # noqa: E402  (the in-process server the tests use)

from zgtool.engine.server import intake  # noqa: E402
from zgtool.engine.server.config import ServeConfig  # noqa: E402

SENDER = r"""
import concurrent.futures as cf, json, sys, httpx
url, size, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
big = json.dumps({"model": "null", "max_tokens": 4, "messages": [{"role": "user", "content": "x" * size}]}).encode()
def one(_):
    with httpx.Client(timeout=300) as c:
        return c.post(url + "/v1/messages", content=big, headers={"content-type": "application/json"}).status_code
with cf.ThreadPoolExecutor(n) as ex:
    print(json.dumps(list(ex.map(one, range(n)))))
"""
TICK_S = 0.002


def _round(url: str, body_bytes: int, hostile: int) -> dict[str, Any]:
    lags: list[float] = []
    stop = threading.Event()

    def tick() -> None:
        while not stop.is_set():
            t = time.perf_counter()
            time.sleep(TICK_S)
            lags.append((time.perf_counter() - t - TICK_S) * 1e3)

    ticker = threading.Thread(target=tick)
    ticker.start()
    before = resource.getrusage(resource.RUSAGE_SELF)
    out = subprocess.run([sys.executable, "-c", SENDER, url, str(body_bytes), str(hostile)],
                         capture_output=True, text=True, check=True)
    after = resource.getrusage(resource.RUSAGE_SELF)
    stop.set()
    ticker.join()
    lags.sort()
    cpu_s = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    return {"max_ms": lags[-1], "p99_ms": lags[int(len(lags) * 0.99)], "cpu_ms_per_request": cpu_s * 1e3 / hostile,
            "statuses": json.loads(out.stdout)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--body-bytes", type=int, default=7_000_000)
    ap.add_argument("--hostile", type=int, default=4)
    args = ap.parse_args()
    served_threshold = intake.PROCESS_BODY_BYTES
    modes = {"worker": (served_threshold, args.body_bytes), "thread": (10**15, args.body_bytes),
             "quiet": (served_threshold, 1000)}
    runs: dict[str, list[dict[str, Any]]] = {m: [] for m in modes}
    cfg = ServeConfig(model="null", host="127.0.0.1", port=0, grace_s=2.0)
    try:
        with serving(cfg) as (built, _, _):
            _round(built.url, args.body_bytes, args.hostile)          # warm-up (starts the worker), dropped
            for _ in range(args.rounds):
                for mode, (threshold, size) in modes.items():
                    intake.PROCESS_BODY_BYTES = threshold
                    runs[mode].append(_round(built.url, size, args.hostile))
    finally:
        intake.PROCESS_BODY_BYTES = served_threshold
    out: dict[str, Any] = {"bench": "body_worker_ab", "body_bytes": args.body_bytes, "hostile": args.hostile,
                           "rounds": args.rounds}
    for mode, rs in runs.items():
        out[mode] = {k: round(statistics.median(r[k] for r in rs), 1) for k in ("max_ms", "p99_ms", "cpu_ms_per_request")}
        out[mode]["max_ms_range"] = [round(min(r["max_ms"] for r in rs), 1), round(max(r["max_ms"] for r in rs), 1)]
        out[mode]["statuses"] = sorted({s for r in rs for s in r["statuses"]})
        m = out[mode]
        print(f"{mode:7s} wake-up lag max {m['max_ms']} ms (rounds {m['max_ms_range'][0]}-{m['max_ms_range'][1]}), "
              f"p99 {m['p99_ms']} ms; server CPU {m['cpu_ms_per_request']} ms per request; statuses {m['statuses']}")
    out["ratio_worker_over_thread"] = {k: round(out["worker"][k] / out["thread"][k], 2)
                                       for k in ("max_ms", "p99_ms", "cpu_ms_per_request")}
    print("worker / thread: " + ", ".join(f"{k} x{v}" for k, v in out["ratio_worker_over_thread"].items()))
    print(json.dumps(out))


if __name__ == "__main__":
    main()

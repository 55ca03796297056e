"""What the fused engine's serving path costs over the floor of its own HTTP stack.

zgtool serve --model null (real parsing, admission, scheduler, KV bookkeeping, Server-Timing,
zero model compute; with no compute to overlap, its engine steps on the event loop) vs a
bare uvicorn+httptools+uvloop ASGI app that answers every request with an equally sized
fixed JSON body (the floor: nothing can be faster on this stack). Non-streaming POST /v1/messages, closed-loop keep-alive load
at concurrency 1 and 32, both servers measured in interleaved slices in one run.

    .venv/bin/python bench/serving_overhead.py [--seconds 6] [--max-tokens 1,16]

Prints a table and, as the LAST line, one JSON object with every figure and the
requests/s ratio zgtool/floor (target >= 0.6). Each server's CPU time per request (from
/proc, all threads) is reported too: on a shared machine it moves less than req/s, and
zgtool's extra CPU per request over the floor is its serving overhead.
ZGTOOL_STEP_DRIVER=thread in the environment runs the null engine on a step thread (A/B).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from zgtool.http.net import free_port as _free_port
from zgtool.stats import percentile

TARGET_RATIO = 0.6


@dataclass(frozen=True)
class Cell:
    system: str
    max_tokens: int
    concurrency: int
    requests: int
    errors: int
    rate_rps: float
    p50_ms: float
    p99_ms: float
    cpu_us_per_req: float     # the server process's CPU time (user+system) per answered request


# -- the floor server (run as a child: --floor PORT BODY_BYTES) -------------------

def run_floor(port: int, body_bytes: int) -> None:
    import uvicorn

    body = json.dumps({"type": "message", "pad": ""}).encode()
    body = json.dumps({"type": "message", "pad": "x" * max(0, body_bytes - len(body))}).encode()
    start = {"type": "http.response.start", "status": 200,
             "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]}
    done = {"type": "http.response.body", "body": body}

    async def app(scope, receive, send):  # type: ignore[no-untyped-def]
        if scope["type"] != "http":
            return
        more = True
        while more:                       # read the request body, as any real server must
            more = (await receive()).get("more_body", False)
        await send(start)
        await send(done)

    uvicorn.run(app, host="127.0.0.1", port=port, loop="uvloop", http="httptools", log_level="warning",
                access_log=False, lifespan="off")


# -- load client: raw keep-alive HTTP/1.1 on asyncio+uvloop, as cheap as we can make it --

def _request(port: int, max_tokens: int) -> bytes:
    body = json.dumps({"model": "null", "max_tokens": max_tokens,
                       "messages": [{"role": "user", "content": "Say something about serving."}]}).encode()
    return (f"POST /v1/messages HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\ncontent-type: application/json\r\n"
            f"content-length: {len(body)}\r\n\r\n").encode() + body


async def _read(reader: asyncio.StreamReader) -> tuple[int, int]:
    head = await reader.readuntil(b"\r\n\r\n")
    status = int(head[9:12])
    i = head.lower().find(b"content-length:")
    n = int(head[i + 15:head.find(b"\r\n", i)])
    await reader.readexactly(n)
    return status, n


async def _load(port: int, raw: bytes, concurrency: int, seconds: float) -> tuple[list[float], int, float]:
    lat: list[float] = []
    errors = 0
    stop = time.perf_counter() + seconds

    async def worker() -> None:
        nonlocal errors
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            while time.perf_counter() < stop:
                t0 = time.perf_counter()
                writer.write(raw)
                status, _ = await _read(reader)
                if status == 200:
                    lat.append((time.perf_counter() - t0) * 1e3)
                else:
                    errors += 1
        finally:
            writer.close()

    t0 = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return lat, errors, time.perf_counter() - t0


_TICK_S = 1.0 / os.sysconf("SC_CLK_TCK")


def _cpu_s(pid: int) -> float:
    """user + system CPU seconds of a process (all its threads), from /proc: on a shared
    machine CPU per request is steadier than wall-clock rates."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) * _TICK_S


def _wait_http(port: int, proc: subprocess.Popen[bytes], raw: bytes) -> int:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"server exited with {proc.returncode}")
        try:
            async def one() -> int:
                reader, writer = await asyncio.open_connection("127.0.0.1", port)
                writer.write(raw)
                _, n = await _read(reader)
                writer.close()
                return n
            return asyncio.run(one())
        except OSError:
            time.sleep(0.2)
    raise SystemExit("server did not start")


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=6.0, help="measured seconds per system and cell")
    ap.add_argument("--slice", type=float, default=1.0, help="interleaving slice (s)")
    ap.add_argument("--concurrency", default="1,32")
    ap.add_argument("--max-tokens", default="1,16", help="output tokens per request (null model)")
    ap.add_argument("--floor", nargs=2, type=int, metavar=("PORT", "BODY_BYTES"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.floor:
        run_floor(*args.floor)
        return
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    asyncio.set_event_loop_policy(__import__("uvloop").EventLoopPolicy())
    concurrencies = [int(c) for c in args.concurrency.split(",")]
    token_counts = [int(t) for t in args.max_tokens.split(",")]
    root = Path(__file__).resolve().parents[1]
    zport = _free_port()
    zg = subprocess.Popen([sys.executable, "-m", "zgtool", "serve", "--model", "null", "--port", str(zport)],
                          cwd=root, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    cells: list[Cell] = []
    floors: list[subprocess.Popen[bytes]] = []
    try:
        for tokens in token_counts:
            raw_z = _request(zport, tokens)
            body_bytes = _wait_http(zport, zg, raw_z)
            fport = _free_port()
            floor = subprocess.Popen([sys.executable, __file__, "--floor", str(fport), str(body_bytes)],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            floors.append(floor)
            raw_f = _request(fport, tokens)
            _wait_http(fport, floor, raw_f)
            systems = {"zgtool": (zport, raw_z), "floor": (fport, raw_f)}
            pids = {"zgtool": zg.pid, "floor": floor.pid}
            for port, raw in systems.values():
                asyncio.run(_load(port, raw, 8, 0.5))      # warm up
            for c in concurrencies:
                lat = {s: [] for s in systems}
                errs = dict.fromkeys(systems, 0)
                wall = dict.fromkeys(systems, 0.0)
                cpu = dict.fromkeys(systems, 0.0)
                names = list(systems)
                for r in range(max(1, round(args.seconds / args.slice))):
                    for name in names[r % 2:] + names[:r % 2]:   # alternate who goes first
                        c0 = _cpu_s(pids[name])
                        got, e, w = asyncio.run(_load(*systems[name], c, args.slice))
                        cpu[name] += _cpu_s(pids[name]) - c0
                        lat[name] += got
                        errs[name] += e
                        wall[name] += w
                for name in names:
                    xs = lat[name]
                    cells.append(Cell(name, tokens, c, len(xs), errs[name], len(xs) / wall[name],
                                      percentile(xs, 50), percentile(xs, 99),
                                      cpu[name] / max(1, len(xs)) * 1e6))
                    print(f"  {name:<7} tokens={tokens:<3} c={c:<3} {cells[-1].rate_rps:8.0f} req/s "
                          f"p50={cells[-1].p50_ms:7.3f} ms p99={cells[-1].p99_ms:7.3f} ms "
                          f"cpu={cells[-1].cpu_us_per_req:6.1f} us/req", file=sys.stderr)
            _stop(floor)
    finally:
        _stop(zg)
        for f in floors:
            _stop(f)
    ratios = {}
    cpu_extra: dict[str, float] = {}
    print(f"\n{'tokens':>6} {'conc':>5} | {'zgtool req/s':>12} {'p50 ms':>8} {'p99 ms':>8} {'cpu us':>7} | "
          f"{'floor req/s':>11} {'p50 ms':>8} {'p99 ms':>8} {'cpu us':>7} | {'ratio':>6} {'+cpu us':>7}")
    for tokens in token_counts:
        for c in concurrencies:
            z = next(x for x in cells if x.system == "zgtool" and x.max_tokens == tokens and x.concurrency == c)
            f = next(x for x in cells if x.system == "floor" and x.max_tokens == tokens and x.concurrency == c)
            ratio = z.rate_rps / f.rate_rps if f.rate_rps else float("nan")
            ratios[f"tokens{tokens}_c{c}"] = round(ratio, 3)
            extra_cpu = z.cpu_us_per_req - f.cpu_us_per_req
            cpu_extra[f"tokens{tokens}_c{c}"] = round(extra_cpu, 1)
            print(f"{tokens:>6} {c:>5} | {z.rate_rps:>12.0f} {z.p50_ms:>8.3f} {z.p99_ms:>8.3f} "
                  f"{z.cpu_us_per_req:>7.1f} | {f.rate_rps:>11.0f} {f.p50_ms:>8.3f} {f.p99_ms:>8.3f} "
                  f"{f.cpu_us_per_req:>7.1f} | {ratio:>6.2f} {extra_cpu:>7.1f}")
    meets = all(v >= TARGET_RATIO for v in ratios.values())
    # the null engine steps on the event loop; a real model's requests also pay the hand-off to
    # and from the step thread: ZGTOOL_STEP_DRIVER=thread measures that path
    driver = os.environ.get("ZGTOOL_STEP_DRIVER") or "loop"
    print(f"\nzgtool/floor requests/s, target >= {TARGET_RATIO}: {'met' if meets else 'NOT met'} "
          f"(step driver: {driver}; cpus={os.cpu_count()}, load avg {os.getloadavg()[0]:.1f})")
    print(json.dumps({"bench": "serving_overhead", "model": "null", "step_driver": driver, "target_ratio": TARGET_RATIO,
                      "ratios_rps": ratios, "extra_cpu_us_per_req": cpu_extra, "meets_target": meets, "cells": [asdict(c) for c in cells],
                      "load_avg_1m": round(os.getloadavg()[0], 2)}))


if __name__ == "__main__":
    main()

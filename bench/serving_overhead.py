"""What the fused engine's serving path costs over the floor of its own HTTP stack, and over one nginx hop.

zgtool serve --model null (real parsing, admission, scheduler, KV bookkeeping, Server-Timing,
zero model compute; with no compute to overlap, its engine steps on the event loop) vs a
bare uvicorn+httptools+uvloop ASGI app that answers every request with an equally sized
fixed body (the floor: nothing can be faster on this stack), POST /v1/messages, closed-loop
keep-alive load at concurrency 1 and 32, every system measured in interleaved slices in one run.

Modes: ``t1`` (one output token, one JSON answer), ``t16`` (16 tokens, one JSON answer) and
``t16s`` (16 tokens streamed as SSE; the floor streams as many chunks of the same total size);
``front`` (not run by default) is GET /health: zgtool's protocol and app with no body and no engine,
against the floor answering a body of the same size, so the front alone is compared through sockets
(bench/serving_breakdown.py cuts the path further, in process).
In modes t1 and front a third system runs beside them: nginx (zgtool/gateway/nginx.py's reference
config, one worker) in front of the same floor app, so one gateway hop's cost is measured in the same
run (in front mode: the hop's cost for the same GET, beside our front's).

    .venv/bin/python bench/serving_overhead.py [--seconds 4] [--modes t1,t16,t16s] [--baseline DIR]

Figures: requests/s of each system and its ratio to the floor; each server's CPU time per
request (user+system from /proc, all threads and, for nginx, its workers and the floor behind
it): zgtool's extra CPU per request over the floor, per streamed token ((t16s - t1) / 15 over the
floor's), and the nginx hop's CPU per request (nginx + floor behind it - floor alone) and p50
latency at c=1; and zgtool's engine's steps per request and mean batch (sequences per step, from its
zg_engine_steps_total and zg_engine_step_sequences_total, read between slices), which tell a gap in
per-request work from steps run on partial batches. Targets: >= 0.8x the floor's requests/s in t1,
>= 0.6x in t16, and fewer extra CPU microseconds per request than the nginx hop. The LAST line is
one JSON object.

--baseline DIR adds another zgtool (``python -m zgtool serve`` run in DIR, e.g. an older commit:
``git archive COMMIT | tar -x -C DIR && ln -s ../engine DIR/zgtool/engine``) to the same
interleaving: before and after on the same load. On a shared machine CPU per request moves less
than requests/s; run it more than once and read the spread.
ZGTOOL_STEP_DRIVER=thread in the environment runs the null engine on a step thread (A/B).
bench/serving_inproc.py measures the same serving path in one process without sockets (steadier
for comparing two trees a few microseconds apart); docs/profile/README.md has both runs' figures.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import asdict, dataclass
from pathlib import Path

from peerlib.machine import cpu_model

from zgtool.http.net import free_port as _free_port
from zgtool.stats import percentile

TARGET_T1 = 0.8     # zgtool/floor requests/s, one token
TARGET_T16 = 0.6    # zgtool/floor requests/s, 16 tokens
MODES = {"t1": (1, False), "t16": (16, False), "t16s": (16, True), "front": (0, False)}


@dataclass(frozen=True)
class Cell:
    system: str
    mode: str
    concurrency: int
    requests: int
    errors: int
    rate_rps: float
    p50_ms: float
    p99_ms: float
    cpu_us_per_req: float     # the server processes' CPU time (user+system) per answered request
    # zgtool's engine (its /metrics, read outside the measured CPU): steps per answered request and
    # sequences per step (the mean batch); None for the floor, nginx and a tree without the counters
    steps_per_req: float | None = None
    mean_batch: float | None = None


# -- the floor server (run as a child: --floor PORT BODY_BYTES CHUNKS) -------------------

def run_floor(port: int, body_bytes: int, chunks: int) -> None:
    """CHUNKS 0: one JSON body of BODY_BYTES with content-length; else a chunked event stream of
    CHUNKS pieces of BODY_BYTES in all (the last send ends the answer, as zgtool's tail does)."""
    import uvicorn

    body = json.dumps({"type": "message", "pad": ""}).encode()
    body = json.dumps({"type": "message", "pad": "x" * max(0, body_bytes - len(body))}).encode()
    if chunks:
        size = max(1, body_bytes // chunks)
        pieces = [b"x" * size] * (chunks - 1) + [b"x" * max(1, body_bytes - size * (chunks - 1))]
        start = {"type": "http.response.start", "status": 200,
                 "headers": [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")]}
        sends = [{"type": "http.response.body", "body": p, "more_body": i < chunks - 1} for i, p in enumerate(pieces)]
    else:
        start = {"type": "http.response.start", "status": 200,
                 "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]}
        sends = [{"type": "http.response.body", "body": body}]

    async def app(scope, receive, send):  # type: ignore[no-untyped-def]
        if scope["type"] != "http":
            return
        more = True
        while more:                       # read the request body, as any real server must
            more = (await receive()).get("more_body", False)
        await send(start)
        for message in sends:
            await send(message)

    uvicorn.run(app, host="127.0.0.1", port=port, loop="uvloop", http="httptools", log_level="warning",
                access_log=False, lifespan="off")


# -- load client: raw keep-alive HTTP/1.1 on asyncio+uvloop, as cheap as we can make it --

def _request(port: int, mode: str) -> bytes:
    """A mode's request: POST /v1/messages, or for ``front`` GET /health (no body, no engine)."""
    if mode == "front":
        return f"GET /health HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n".encode()
    max_tokens, stream = MODES[mode]
    body = json.dumps({"model": "null", "max_tokens": max_tokens, "stream": stream,
                       "messages": [{"role": "user", "content": "Say something about serving."}]}).encode()
    return (f"POST /v1/messages HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\ncontent-type: application/json\r\n"
            f"content-length: {len(body)}\r\n\r\n").encode() + body


async def _read(reader: asyncio.StreamReader) -> tuple[int, int]:
    """One answer: (status, body bytes); content-length or chunked."""
    head = await reader.readuntil(b"\r\n\r\n")
    status = int(head[9:12])
    low = head.lower()
    i = low.find(b"content-length:")
    if i >= 0:
        n = int(head[i + 15:head.find(b"\r\n", i)])
        await reader.readexactly(n)
        return status, n
    n = 0
    while True:                            # transfer-encoding: chunked
        size = int((await reader.readuntil(b"\r\n"))[:-2], 16)
        await reader.readexactly(size + 2)
        if size == 0:
            return status, n
        n += size


async def _read_fast(reader: asyncio.StreamReader) -> int:
    """One answer's status, reading a chunked stream by whole reads up to its last chunk (a load
    client that parsed 17 chunks per answer would be slower than the servers it measures)."""
    head = await reader.readuntil(b"\r\n\r\n")
    i = head.lower().find(b"content-length:")
    if i >= 0:
        await reader.readexactly(int(head[i + 15:head.find(b"\r\n", i)]))
    else:
        tail = b""
        while not tail.endswith(b"\r\n0\r\n\r\n"):    # the pieces end in \n or x, never in this
            data = await reader.read(65536)
            if not data:
                raise ConnectionError("closed mid-answer")
            tail = (tail + data)[-16:]
    return int(head[9:12])


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
                status = await _read_fast(reader)
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


def _cpu_s(pids: list[int]) -> float:
    """user + system CPU seconds of processes (all their threads), from /proc: on a shared
    machine CPU per request is steadier than wall-clock rates."""
    total = 0.0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) * _TICK_S
    return total


def _children(pid: int) -> list[int]:
    try:
        return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def _wait_http(port: int, proc: subprocess.Popen[bytes], raw: bytes) -> int:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"server exited with {proc.returncode}")
        try:
            async def one() -> tuple[int, int]:
                reader, writer = await asyncio.open_connection("127.0.0.1", port)
                writer.write(raw)
                got = await _read(reader)
                writer.close()
                return got
            status, n = asyncio.run(one())
            if status == 200:
                return n
        except OSError:
            pass
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


def _start_nginx(upstream_port: int, run_dir: Path) -> tuple[subprocess.Popen[bytes], int]:
    from zgtool.gateway.nginx import NginxServer, find_nginx, nginx_argv, write_config

    port = _free_port()
    write_config([NginxServer("hop", port, f"127.0.0.1:{upstream_port}", mode="streaming")], run_dir, workers=1)
    proc = subprocess.Popen(nginx_argv(find_nginx(), run_dir), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return proc, port


# -- measuring ----------------------------------------------------------------------

@dataclass
class System:
    name: str
    port: int
    raw: bytes
    pids: list[int]
    engine: bool = False      # a zgtool serve: its step counters are read around each slice


_STEP_COUNTERS = (b"zg_engine_steps_total{", b"zg_engine_step_sequences_total{")


def _engine_steps(port: int) -> tuple[float, float] | None:
    """(steps, sequences computed) from a zgtool engine's /metrics; None where it has no such counters."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
            text = r.read()
    except OSError:
        return None
    found: dict[bytes, float] = {}
    for line in text.splitlines():
        for name in _STEP_COUNTERS:
            if line.startswith(name):
                found[name] = float(line.rsplit(b" ", 1)[1])
    if len(found) != len(_STEP_COUNTERS):
        return None
    return found[_STEP_COUNTERS[0]], found[_STEP_COUNTERS[1]]


def _measure(systems: list[System], mode: str, concurrency: int, seconds: float, slice_s: float) -> list[Cell]:
    lat: dict[str, list[float]] = {s.name: [] for s in systems}
    errs = dict.fromkeys(lat, 0)
    wall = dict.fromkeys(lat, 0.0)
    cpu = dict.fromkeys(lat, 0.0)
    steps: dict[str, list[float] | None] = {s.name: [0.0, 0.0] if s.engine else None for s in systems}
    for r in range(max(1, round(seconds / slice_s))):
        k = r % len(systems)
        for s in systems[k:] + systems[:k]:          # rotate who goes first
            before = _engine_steps(s.port) if steps[s.name] is not None else None
            c0 = _cpu_s(s.pids)
            got, e, w = asyncio.run(_load(s.port, s.raw, concurrency, slice_s))
            cpu[s.name] += _cpu_s(s.pids) - c0
            lat[s.name] += got
            errs[s.name] += e
            wall[s.name] += w
            after = _engine_steps(s.port) if before is not None else None
            acc = steps[s.name]
            if before is None or after is None or acc is None:
                steps[s.name] = None
            else:
                acc[0] += after[0] - before[0]
                acc[1] += after[1] - before[1]
    cells = []
    for s in systems:
        xs = lat[s.name]
        acc = steps[s.name]
        cell = Cell(s.name, mode, concurrency, len(xs), errs[s.name], len(xs) / wall[s.name],
                    percentile(xs, 50), percentile(xs, 99), cpu[s.name] / max(1, len(xs)) * 1e6,
                    None if acc is None or not xs else round(acc[0] / len(xs), 3),
                    None if acc is None or not acc[0] else round(acc[1] / acc[0], 2))
        cells.append(cell)
        batch = ("" if cell.mean_batch is None or cell.steps_per_req is None
                 else f" steps/req={cell.steps_per_req:.2f} mean batch={cell.mean_batch:.1f}")
        print(f"  {s.name:<8} {mode:<4} c={concurrency:<3} {cell.rate_rps:8.0f} req/s p50={cell.p50_ms:7.3f} ms "
              f"p99={cell.p99_ms:7.3f} ms cpu={cell.cpu_us_per_req:6.1f} us/req{batch}", file=sys.stderr)
    return cells


def _start_zgtool(cwd: Path) -> tuple[subprocess.Popen[bytes], int]:
    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-m", "zgtool", "serve", "--model", "null", "--port", str(port)],
                            cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return proc, port


def run(modes: list[str], concurrencies: list[int], seconds: float, slice_s: float,
        baseline: Path | None) -> list[Cell]:
    root = Path(__file__).resolve().parents[1]
    procs: list[subprocess.Popen[bytes]] = []
    cells: list[Cell] = []
    try:
        zg, zport = _start_zgtool(root)
        procs.append(zg)
        zgs = [("zgtool", zg, zport)]
        if baseline is not None:
            base, bport = _start_zgtool(baseline)
            procs.append(base)
            zgs.append(("baseline", base, bport))
        for mode in modes:
            tokens, stream = MODES[mode]
            systems = []
            body_bytes = 0
            for name, proc, port in zgs:
                raw = _request(port, mode)
                body_bytes = _wait_http(port, proc, raw)
                systems.append(System(name, port, raw, [proc.pid], engine=mode != "front"))
            fport = _free_port()
            floor = subprocess.Popen([sys.executable, __file__, "--floor", str(fport), str(body_bytes),
                                      str(tokens + 1 if stream else 0)],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            procs.append(floor)
            raw_f = _request(fport, mode)
            _wait_http(fport, floor, raw_f)
            systems.append(System("floor", fport, raw_f, [floor.pid]))
            nginx = None
            if mode in ("t1", "front"):
                nginx, nport = _start_nginx(fport, Path(tempfile.mkdtemp(prefix="zg-serving-nginx-")))
                procs.append(nginx)
                raw_n = _request(nport, mode)
                _wait_http(nport, nginx, raw_n)
                # the hop's whole cost: nginx's master and workers, and the floor behind it
                systems.append(System("nginx", nport, raw_n, [nginx.pid, *_children(nginx.pid), floor.pid]))
            for s in systems:
                asyncio.run(_load(s.port, s.raw, 8, 0.5))      # warm up
            for c in concurrencies:
                cells += _measure(systems, mode, c, seconds, slice_s)
            if nginx is not None:
                _stop(nginx)
            _stop(floor)
    finally:
        for p in procs:
            _stop(p)
    return cells


# -- the summary ----------------------------------------------------------------------

def _cell(cells: list[Cell], system: str, mode: str, c: int) -> Cell | None:
    return next((x for x in cells if x.system == system and x.mode == mode and x.concurrency == c), None)


def summarize(cells: list[Cell], modes: list[str], concurrencies: list[int]) -> dict[str, object]:
    out: dict[str, dict[str, float]] = {"ratio_rps": {}, "extra_cpu_us_per_req": {}, "extra_cpu_us_per_streamed_token": {},
                                        "nginx_hop_cpu_us_per_req": {}, "nginx_hop_p50_us": {}, "nginx_ratio_rps": {},
                                        "extra_p50_us": {}, "baseline_ratio_rps": {}, "baseline_extra_cpu_us_per_req": {},
                                        "mean_batch": {}}
    for mode in modes:
        for c in concurrencies:
            key = f"{mode}_c{c}"
            f = _cell(cells, "floor", mode, c)
            z = _cell(cells, "zgtool", mode, c)
            b = _cell(cells, "baseline", mode, c)
            n = _cell(cells, "nginx", mode, c)
            if f is None or z is None:
                continue
            out["ratio_rps"][key] = round(z.rate_rps / f.rate_rps, 3)
            out["extra_cpu_us_per_req"][key] = round(z.cpu_us_per_req - f.cpu_us_per_req, 1)
            out["extra_p50_us"][key] = round((z.p50_ms - f.p50_ms) * 1e3, 1)
            if z.mean_batch is not None:
                out["mean_batch"][key] = z.mean_batch
            if b is not None:
                out["baseline_ratio_rps"][key] = round(b.rate_rps / f.rate_rps, 3)
                out["baseline_extra_cpu_us_per_req"][key] = round(b.cpu_us_per_req - f.cpu_us_per_req, 1)
            if n is not None:
                out["nginx_ratio_rps"][key] = round(n.rate_rps / f.rate_rps, 3)
                out["nginx_hop_cpu_us_per_req"][key] = round(n.cpu_us_per_req - f.cpu_us_per_req, 1)
                out["nginx_hop_p50_us"][key] = round((n.p50_ms - f.p50_ms) * 1e3, 1)
    for c in concurrencies:
        for system, name in (("zgtool", "extra_cpu_us_per_streamed_token"), ("baseline", "baseline_extra_cpu_us_per_streamed_token")):
            z1, zs = _cell(cells, system, "t1", c), _cell(cells, system, "t16s", c)
            f1, fs = _cell(cells, "floor", "t1", c), _cell(cells, "floor", "t16s", c)
            if None in (z1, zs, f1, fs):
                continue
            assert z1 and zs and f1 and fs
            out.setdefault(name, {})[f"c{c}"] = round(((zs.cpu_us_per_req - z1.cpu_us_per_req)
                                                       - (fs.cpu_us_per_req - f1.cpu_us_per_req)) / 15, 2)
    checks = {}
    for c in concurrencies:
        if f"t1_c{c}" in out["ratio_rps"]:
            checks[f"t1_c{c}_ratio>={TARGET_T1}"] = out["ratio_rps"][f"t1_c{c}"] >= TARGET_T1
        if f"t16_c{c}" in out["ratio_rps"]:
            checks[f"t16_c{c}_ratio>={TARGET_T16}"] = out["ratio_rps"][f"t16_c{c}"] >= TARGET_T16
        hop = out["nginx_hop_cpu_us_per_req"].get(f"t1_c{c}")
        if hop is not None:
            checks[f"t1_c{c}_extra_cpu<nginx_hop"] = out["extra_cpu_us_per_req"][f"t1_c{c}"] < hop
    return {**out, "checks": checks, "meets_targets": bool(checks) and all(checks.values())}


def render(cells: list[Cell], summary: dict[str, object], modes: list[str], concurrencies: list[int]) -> None:
    systems = [s for s in ("zgtool", "baseline", "nginx") if any(x.system == s for x in cells)]
    print(f"\n{'mode':>5} {'conc':>4} | {'floor req/s':>11} {'p50 ms':>7} {'cpu us':>7} | "
          + " | ".join(f"{s + ' req/s':>14} {'ratio':>5} {'p50 ms':>7} {'+cpu us':>7}" for s in systems))
    for mode in modes:
        for c in concurrencies:
            f = _cell(cells, "floor", mode, c)
            if f is None:
                continue
            row = f"{mode:>5} {c:>4} | {f.rate_rps:>11.0f} {f.p50_ms:>7.3f} {f.cpu_us_per_req:>7.1f} | "
            parts = []
            for s in systems:
                x = _cell(cells, s, mode, c)
                parts.append(" " * 37 if x is None else
                             f"{x.rate_rps:>14.0f} {x.rate_rps / f.rate_rps:>5.2f} {x.p50_ms:>7.3f} "
                             f"{x.cpu_us_per_req - f.cpu_us_per_req:>7.1f}")
            print(row + " | ".join(parts))
    s = summary
    print()
    for c in concurrencies:
        extra = s["extra_cpu_us_per_req"].get(f"t1_c{c}")  # type: ignore[attr-defined]
        hop = s["nginx_hop_cpu_us_per_req"].get(f"t1_c{c}")  # type: ignore[attr-defined]
        tok = s.get("extra_cpu_us_per_streamed_token", {}).get(f"c{c}")  # type: ignore[attr-defined]
        if extra is not None:
            print(f"c={c}: zgtool +{extra} us CPU per request over the floor"
                  + (f"; one nginx hop +{hop} us ({extra / hop:.2f}x the hop)" if hop else "")
                  + (f"; +{tok} us CPU per streamed token" if tok is not None else ""))
    hop_p50 = s["nginx_hop_p50_us"].get(f"t1_c{concurrencies[0]}")  # type: ignore[attr-defined]
    z_p50 = s["extra_p50_us"].get(f"t1_c{concurrencies[0]}")  # type: ignore[attr-defined]
    if hop_p50 is not None and z_p50 is not None:
        print(f"c={concurrencies[0]} p50 latency: zgtool +{z_p50} us over the floor, one nginx hop +{hop_p50} us")
    batches = s["mean_batch"]
    if batches:
        print("zgtool's engine, sequences per step: " + ", ".join(
            f"{k.replace('_c', ' c=')} {v}" for k, v in batches.items()))  # type: ignore[attr-defined]
    checks = s["checks"]
    print("targets: " + ", ".join(f"{k} {'met' if v else 'NOT met'}" for k, v in checks.items()))  # type: ignore[attr-defined]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=4.0, help="measured seconds per system and cell")
    ap.add_argument("--slice", type=float, default=0.5, help="interleaving slice (s)")
    ap.add_argument("--concurrency", default="1,32")
    ap.add_argument("--modes", default="t1,t16,t16s", help="t1, t16 (JSON answers), t16s (16 streamed tokens), front (GET /health)")
    ap.add_argument("--baseline", type=Path, help="another zgtool source tree to measure beside this one")
    ap.add_argument("--floor", nargs=3, type=int, metavar=("PORT", "BODY_BYTES", "CHUNKS"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.floor:
        run_floor(*args.floor)
        return
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    asyncio.set_event_loop_policy(__import__("uvloop").EventLoopPolicy())
    concurrencies = [int(c) for c in args.concurrency.split(",")]
    modes = [m for m in args.modes.split(",") if m]
    unknown = [m for m in modes if m not in MODES]
    if unknown:
        raise SystemExit(f"--modes: unknown {', '.join(unknown)}; use {', '.join(MODES)}")
    cells = run(modes, concurrencies, args.seconds, args.slice, args.baseline)
    summary = summarize(cells, modes, concurrencies)
    render(cells, summary, modes, concurrencies)
    # the null engine steps on the event loop; a real model's requests also pay the hand-off to
    # and from the step thread: ZGTOOL_STEP_DRIVER=thread measures that path
    driver = os.environ.get("ZGTOOL_STEP_DRIVER") or "loop"
    cpu = cpu_model()
    print(f"(step driver: {driver}; {cpu}, cpus={os.cpu_count()}, load avg {os.getloadavg()[0]:.1f})")
    print(json.dumps({"bench": "serving_overhead", "model": "null", "step_driver": driver, "cpu": cpu,
                      "targets": {"t1_ratio": TARGET_T1, "t16_ratio": TARGET_T16, "extra_cpu_below_nginx_hop": True},
                      **summary, "cells": [asdict(c) for c in cells], "load_avg_1m": round(os.getloadavg()[0], 2)}))


if __name__ == "__main__":
    main()

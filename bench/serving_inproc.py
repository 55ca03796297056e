"""The fused engine's serving path in one process, with no sockets: CPU microseconds per request.

``zgtool serve --model null``'s real pieces (its protocol class, app, admission, scheduler, KV
bookkeeping, Server-Timing) on one uvloop loop, fed keep-alive requests over stand-in transports
that keep what is written. No kernel, no client, no other process: what is left is the Python of
the request path, steady enough to compare two trees a few microseconds apart (bench/serving_overhead.py
measures the same path over real sockets beside the uvicorn floor and nginx).

    .venv/bin/python bench/serving_inproc.py [--requests 20000] [--concurrency 1,32] [--modes t1,t16,t16s]
        [--profile FILE.pstats]

Each cell: ``concurrency`` connections each send one request at a time (the next when the answer
is complete), for ``requests`` answers; the figure is process CPU time per answer, the best of
``--rounds`` rounds. Every answer is checked (status 200, a complete body); the garbage
collections run while serving are counted. The LAST line is one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import gc
import json
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from peerlib.machine import cpu_model  # noqa: E402

MODES = {"t1": (1, False), "t16": (16, False), "t16s": (16, True)}


class _Transport(asyncio.Transport):
    """Keeps writes; tells its connection when an answer is complete (content-length or last chunk)."""

    def __init__(self, conn: _Conn) -> None:
        super().__init__()
        self._conn = conn
        self._closing = False

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self._conn.got(bytes(data))

    def writelines(self, parts: Any) -> None:
        for p in parts:
            self.write(p)

    def is_closing(self) -> bool:
        return self._closing

    def close(self) -> None:
        self._closing = True

    def abort(self) -> None:
        self._closing = True

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        if name in ("peername", "sockname"):
            return ("127.0.0.1", 40000)
        return default

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def get_write_buffer_size(self) -> int:
        return 0


class _Conn:
    def __init__(self, raw: bytes, stream: bool, budget: list[int]) -> None:
        self.raw = raw
        self.stream = stream
        self.buf = b""
        self.budget = budget      # [requests still to send]
        self.answers = 0
        self.proto: Any = None

    def got(self, data: bytes) -> None:
        self.buf += data
        head_end = self.buf.find(b"\r\n\r\n")
        if head_end < 0:
            return
        if not self.buf.startswith(b"HTTP/1.1 200"):
            raise SystemExit(f"not a 200 answer: {self.buf[:200]!r}")
        if self.stream:
            if not self.buf.endswith(b"\r\n0\r\n\r\n"):
                return
        else:
            i = self.buf.find(b"content-length: ")
            n = int(self.buf[i + 16:self.buf.find(b"\r\n", i)])
            if len(self.buf) < head_end + 4 + n:
                return
        self.buf = b""
        self.answers += 1
        if self.budget[0] > 0:       # the next request, as a client would send it: after the answer
            self.budget[0] -= 1
            asyncio.get_running_loop().call_soon(self.proto.data_received, self.raw)


def _request(tokens: int, stream: bool) -> bytes:
    body = json.dumps({"model": "null", "max_tokens": tokens, "stream": stream,
                       "messages": [{"role": "user", "content": "Say something about serving."}]}).encode()
    return (b"POST /v1/messages HTTP/1.1\r\nHost: 127.0.0.1:8000\r\ncontent-type: application/json\r\n"
            b"content-length: %d\r\n\r\n%s" % (len(body), body))


def null_server() -> tuple[Any, Any]:
    """``zgtool serve --model null``'s built parts and its uvicorn server, loaded, listening nowhere."""
    from zgtool.engine.server.config import ServeConfig
    from zgtool.engine.server.run import build, make_server

    built = build(replace(ServeConfig(model="null"), port=0))
    server = make_server(built)
    server.config.load()
    return built, server


def start_serving(built: Any, server: Any, loop: asyncio.AbstractEventLoop) -> Callable[[], Any]:
    """Start the engine on ``loop`` as serve's lifespan does; a factory of the server's protocol, one
    per stand-in connection."""
    built.engine.start(loop)
    server.server_state.tasks = built.app.request_tasks = set()

    def make() -> Any:
        return server.config.http_protocol_class(config=server.config, server_state=server.server_state,
                                                 app_state={}, _loop=loop)
    return make


async def _cell(make: Callable[[], Any], mode: str, concurrency: int, requests: int) -> float:
    tokens, stream = MODES[mode]
    return await drive(make, _request(tokens, stream), stream, concurrency, requests)


async def drive(make: Any, raw: bytes, stream: bool, concurrency: int, requests: int) -> float:
    """``concurrency`` stand-in connections, each a protocol from ``make()``, sending ``raw`` one at a
    time until ``requests`` answers (each checked) are in; process CPU microseconds per answer."""
    budget = [requests - concurrency]
    conns = []
    for _ in range(concurrency):
        c = _Conn(raw, stream, budget)
        c.proto = make()
        c.proto.connection_made(_Transport(c))
        conns.append(c)
    c0 = time.process_time()
    for c in conns:
        c.proto.data_received(raw)
    while sum(c.answers for c in conns) < requests:
        await asyncio.sleep(0)
        if all(c.answers == 0 for c in conns) and time.process_time() - c0 > 30:
            raise SystemExit("no answers")
    spent = time.process_time() - c0
    for c in conns:
        c.proto.connection_lost(None)
    return spent / requests * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=20000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=2000, help="requests per cell before the measured rounds")
    ap.add_argument("--concurrency", default="1,32")
    ap.add_argument("--modes", default="t1,t16,t16s")
    ap.add_argument("--profile", type=Path, help="write a cProfile of one more round of each cell here")
    args = ap.parse_args()
    import logging

    import uvloop

    from zgtool.engine.server.run import freeze_heap
    logging.disable(logging.WARNING)
    built, server = null_server()
    freeze_heap()
    results: dict[str, float] = {}
    collections = [0]          # garbage collections while serving (serve's threshold: run.freeze_heap)

    def count(phase: str, info: dict[str, int]) -> None:
        if phase == "stop":
            collections[0] += 1
    gc.callbacks.append(count)

    async def go() -> None:
        make = start_serving(built, server, asyncio.get_running_loop())
        for mode in args.modes.split(","):
            for c in (int(x) for x in args.concurrency.split(",")):
                await _cell(make, mode, c, max(c, args.warmup))      # warm up
                best = min([await _cell(make, mode, c, args.requests) for _ in range(args.rounds)])
                results[f"{mode}_c{c}"] = round(best, 2)
                print(f"{mode:<4} c={c:<3} {best:7.2f} us CPU per request", file=sys.stderr)
                if args.profile is not None:
                    prof = cProfile.Profile()
                    prof.enable()
                    await _cell(make, mode, c, args.requests)
                    prof.disable()
                    prof.dump_stats(f"{args.profile}.{mode}_c{c}")
        await built.engine.shutdown(1.0)

    uvloop.run(go())
    built.sock.close()
    print(f"garbage collections while serving: {collections[0]}", file=sys.stderr)
    print(json.dumps({"bench": "serving_inproc", "model": "null", "cpu": cpu_model(), "cpu_us_per_req": results,
                      "gc_collections": collections[0]}))


if __name__ == "__main__":
    main()

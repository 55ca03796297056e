"""How much of the serving floor is uvicorn's per-request machinery: CPU microseconds per request, in one
process with no sockets, of bench/serving_overhead.py's floor (a bare ASGI app answering a fixed body
under uvicorn's httptools protocol) and of a bare asyncio protocol over the same httptools parser that
writes the same answer from its message-complete callback (no request task, no cycle, no ASGI sends).

    .venv/bin/python bench/front_floors.py [--requests 20000] [--rounds 3] [--concurrency 1,32]

Both are driven by bench/serving_inproc.py's stand-in connections (keep-alive, the next request after
the answer, every answer checked), so the client's own Python is in both figures. The gap between them
bounds what a front of our own could save per request over uvicorn's; zgtool's whole serving path on
the same load is bench/serving_inproc.py's t1 figure (docs/profile/README.md, fourth pass).
Prints both systems and their ratio per concurrency; the LAST line is one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from peerlib.machine import cpu_model  # noqa: E402
from serving_inproc import _request, drive  # noqa: E402

BODY = json.dumps({"type": "message", "pad": "x" * 300}).encode()


async def floor_app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """serving_overhead's floor: a fixed JSON body with content-length."""
    if scope["type"] != "http":
        return
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(BODY)).encode())]})
    await send({"type": "http.response.body", "body": BODY})


class BareProtocol(asyncio.Protocol):
    """httptools callbacks collecting what uvicorn's collect (URL, headers, body); the answer is
    written from on_message_complete, in the same read."""

    HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n" % len(BODY)

    def __init__(self) -> None:
        import httptools

        self.parser = httptools.HttpRequestParser(self)
        self.url = b""
        self.headers: list[tuple[bytes, bytes]] = []
        self.body = b""
        self.transport: Any = None

    def connection_made(self, transport: Any) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.parser.feed_data(data)

    def on_message_begin(self) -> None:
        self.url = b""
        self.headers = []
        self.body = b""

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name.lower(), value))

    def on_body(self, body: bytes) -> None:
        self.body += body

    def on_message_complete(self) -> None:
        self.transport.write(self.HEAD + BODY)


async def _cell(make: Any, concurrency: int, requests: int) -> float:
    return await drive(make, _request(1, False), False, concurrency, requests)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=20000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--concurrency", default="1,32")
    args = ap.parse_args()
    import uvloop
    from uvicorn.config import Config
    from uvicorn.server import ServerState

    logging.disable(logging.WARNING)
    results: dict[str, dict[str, float]] = {"uvicorn_floor": {}, "bare_protocol": {}}

    async def go() -> None:
        loop = asyncio.get_running_loop()
        cfg = Config(floor_app, http="httptools", loop="uvloop", lifespan="off", access_log=False)
        cfg.load()
        state = ServerState()

        def uvicorn_floor() -> Any:
            return cfg.http_protocol_class(config=cfg, server_state=state, app_state={}, _loop=loop)

        for c in (int(x) for x in args.concurrency.split(",")):
            for name, make in (("uvicorn_floor", uvicorn_floor), ("bare_protocol", BareProtocol)):
                await _cell(make, c, max(c, args.requests // 10))           # warm up
                # each system's best of its rounds, the two measured one after the other per concurrency
                results[name][f"c{c}"] = round(min([await _cell(make, c, args.requests)
                                                    for _ in range(args.rounds)]), 2)

    uvloop.run(go())
    ratios = {k: round(results["bare_protocol"][k] / results["uvicorn_floor"][k], 3) for k in results["uvicorn_floor"]}
    print(f"{'conc':>5} | {'uvicorn floor us':>16} | {'bare protocol us':>16} | bare/floor")
    for k in results["uvicorn_floor"]:
        print(f"{k[1:]:>5} | {results['uvicorn_floor'][k]:16.1f} | {results['bare_protocol'][k]:16.1f} | {ratios[k]:.2f}x")
    print(json.dumps({"bench": "front_floors", "cpu": cpu_model(), "cpu_us_per_req": results,
                      "ratio_bare_over_floor": ratios}))


if __name__ == "__main__":
    main()

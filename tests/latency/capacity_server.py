"""A real local origin of known capacity: SLOTS requests served at once, each holding its slot for
SERVICE_MS; the rest wait their turn. Capacity = SLOTS / SERVICE_MS, so a load sweep's knee is known.

    python capacity_server.py --slots 3 --service-ms 50

Answers like fixture_server.py's origin (Anthropic/OpenAI, stream or whole body, Server-Timing).
Binds 127.0.0.1 port 0 and prints "PORT <n>" once listening.
"""

from __future__ import annotations

import argparse
import asyncio
import socket
import sys
from typing import Any

import uvicorn
from fixture_server import Origin


class Capacity:
    def __init__(self, slots: int, service_ms: float) -> None:
        self.slots = slots
        self.service_s = service_ms / 1e3
        self.origin = Origin(0, 0.0)
        self.sem: asyncio.Semaphore | None = None

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        if self.sem is None:
            self.sem = asyncio.Semaphore(self.slots)
        async with self.sem:
            await asyncio.sleep(self.service_s)
            await self.origin(scope, receive, send)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--slots", type=int, required=True)
    ap.add_argument("--service-ms", type=float, required=True)
    args = ap.parse_args()
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)   # TCP_NODELAY on accept
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen(256)
    config = uvicorn.Config(Capacity(args.slots, args.service_ms), http="httptools", loop="asyncio",
                            log_level="warning", access_log=False, lifespan="off")
    print(f"PORT {sock.getsockname()[1]}", flush=True)
    uvicorn.Server(config).run(sockets=[sock])
    sys.exit(0)


if __name__ == "__main__":
    main()

"""A tiny real HTTP/1.1 proxy that holds every request for a fixed delay before forwarding it.

    python delay_proxy.py --upstream 127.0.0.1:PORT --delay-ms 1.0

Binds 127.0.0.1 port 0 and prints "PORT <n>". Keep-alive, one upstream connection per client
connection, bodies framed by Content-Length only (the origin's whole-body answers). The delay is
a busy wait on perf_counter, so it is as exact as the clock: the known tax of a gateway.
"""

from __future__ import annotations

import argparse
import socket
import sys
import threading
from time import perf_counter


def _read_message(f) -> bytes | None:  # noqa: ANN001 - a buffered socket file
    head = b""
    while True:
        line = f.readline()
        if not line:
            return None
        head += line
        if line in (b"\r\n", b"\n"):
            break
    length = 0
    for line in head.split(b"\r\n"):
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value.strip())
    return head + (f.read(length) if length else b"")


def _serve(client: socket.socket, upstream: tuple[str, int], delay_s: float) -> None:
    up = socket.create_connection(upstream)
    for s in (client, up):
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    cf, uf = client.makefile("rb"), up.makefile("rb")
    try:
        while (request := _read_message(cf)) is not None:
            deadline = perf_counter() + delay_s
            while perf_counter() < deadline:
                pass
            up.sendall(request)
            response = _read_message(uf)
            if response is None:
                break
            client.sendall(response)
    except OSError:
        pass
    finally:
        client.close()
        up.close()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--upstream", required=True)
    ap.add_argument("--delay-ms", type=float, default=1.0)
    args = ap.parse_args()
    host, port = args.upstream.rsplit(":", 1)
    srv = socket.socket()
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind(("127.0.0.1", 0))
    srv.listen(64)
    print(f"PORT {srv.getsockname()[1]}", flush=True)
    while True:
        conn, _ = srv.accept()
        threading.Thread(target=_serve, args=(conn, (host, int(port)), args.delay_ms / 1e3), daemon=True).start()


if __name__ == "__main__":
    sys.exit(main())

"""A one-request client on zgtool's instrumented stream, run as its own process so that a test can
stop it (SIGSTOP) while it waits for the answer: `python lag_client.py PORT` writes one request,
reads once, and prints its socket marks as JSON."""

from __future__ import annotations

import json
import sys

from zgtool.latency.transport import MARKS, _ResolvedBackend


def main(port: int) -> None:
    stream = _ResolvedBackend().connect_tcp("127.0.0.1", port, timeout=30)
    MARKS.reset(has_body=False)
    MARKS.armed = True
    stream.write(b"GET / HTTP/1.1\r\nhost: x\r\n\r\n")
    data = stream.read(65536, timeout=30)
    print(json.dumps({"bytes": len(data), "first_write_ns": MARKS.first_write_ns,
                      "first_read_ns": MARKS.first_read_ns, "first_lag_ns": MARKS.first_lag_ns}), flush=True)
    stream.close()


if __name__ == "__main__":
    main(int(sys.argv[1]))

"""A one-request client on zgtool's instrumented stream, run as its own process so that a test can
stop it (SIGSTOP) while it waits for the answer.

    python lag_client.py PORT            writes one request, reads once, prints its socket marks as JSON
    python lag_client.py PORT measure    one latency-split stream request (OpenAI) to 127.0.0.1:PORT, prints
                                         the sample's points, its start (t0_ns) and every read's arrival/slack
"""

from __future__ import annotations

import json
import sys

from zgtool.latency.wire.transport import MARKS, _ResolvedBackend


def read_once(port: int) -> None:
    stream = _ResolvedBackend().connect_tcp("127.0.0.1", port, timeout=30)
    MARKS.reset(has_body=False)
    MARKS.armed = True
    stream.write(b"GET / HTTP/1.1\r\nhost: x\r\n\r\n")
    data = stream.read(65536, timeout=30)
    print(json.dumps({"bytes": len(data), "first_write_ns": MARKS.first_write_ns,
                      "first_read_ns": MARKS.first_read_ns, "first_lag_ns": MARKS.first_lag_ns}), flush=True)
    stream.close()


def measure(port: int) -> None:
    from zgtool.latency.config import SplitConfig
    from zgtool.latency.wire.client import Endpoint, Session
    from zgtool.targets import Target

    cfg = SplitConfig(num_requests=1, warmup=0, stream=True, timeout_s=60)
    session = Session(Endpoint.build(Target("t", f"http://127.0.0.1:{port}", api="openai"), cfg), cfg, None)
    s = session.measure(0, 0, 0, 0)
    session.close()
    print(json.dumps({"ok": s.ok, "error": s.error, "t0_ns": round(s.start_s * 1e9),
                      "first_write_ns": MARKS.first_write_ns, "lagged": s.lagged, "client_lag_ms": s.client_lag_ms,
                      **{k: getattr(s, k) for k in ("ttfb_ms", "ttfb_headers_ms", "ttfb_body_ms", "ttft_any_ms",
                                                    "ttft_ms")},
                      "arrivals": MARKS.arrivals, "slack": MARKS.slack}), flush=True)


if __name__ == "__main__":
    if sys.argv[2:] == ["measure"]:
        measure(int(sys.argv[1]))
    else:
        read_once(int(sys.argv[1]))

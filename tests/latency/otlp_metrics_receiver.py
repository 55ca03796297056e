"""A real OTLP/HTTP metrics endpoint for tests: POST /v1/metrics bodies decoded with the official
opentelemetry-proto classes (the test extra), kept in order."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class MetricsReceiver:
    """A real OTLP/HTTP metrics endpoint: POST /v1/metrics bodies decoded with the official classes."""

    def __init__(self) -> None:
        from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest

        self.requests: list[ExportMetricsServiceRequest] = []
        self.content_types: list[str] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                body = self.rfile.read(int(self.headers["Content-Length"]))
                if self.path != "/v1/metrics":
                    self.send_response(404)
                    self.end_headers()
                    return
                outer.content_types.append(self.headers["Content-Type"])
                outer.requests.append(ExportMetricsServiceRequest.FromString(body))
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def metrics(self) -> dict[str, Any]:
        """name -> Metric of every export received."""
        return {m.name: m for req in self.requests for rm in req.resource_metrics for sm in rm.scope_metrics
                for m in sm.metrics}


def attrs(point: Any) -> dict[str, object]:
    out: dict[str, object] = {}
    for kv in point.attributes:
        v = kv.value
        out[kv.key] = v.int_value if v.HasField("int_value") else v.string_value
    return out

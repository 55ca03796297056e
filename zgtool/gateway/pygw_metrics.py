"""pygw's own Prometheus metrics (GET /metrics, text format), in a registry of its own:
requests by route and status, the upstream call's latency, pygw's own overhead, retries.

    pygw_requests_total{route, status}      answers sent (status 0: the client left first)
    pygw_upstream_latency_seconds           POST /v1/messages upstream: request sent -> response
                                            headers (for a stream, not its last token)
    pygw_overhead_seconds                   pygw's own phases before the answer starts (auth,
                                            rate limit, cache, translate, moderation): gw_total
                                            minus the body read and the upstream call
    pygw_upstream_retries_total             retries performed (only with --max-retries)
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

CONTENT_TYPE = b"text/plain; version=0.0.4; charset=utf-8"
ROUTES = ("/v1/messages", "/v1/chat/completions", "/v1/messages/count_tokens", "/v1/models", "/admin", "/health",
          "/metrics")
# pygw's overhead is tens of µs to a few ms; the upstream call ms to minutes
_OVERHEAD_BUCKETS_S = (0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0)
_UPSTREAM_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
                       300.0)


def route_of(path: str) -> str:
    """A bounded label for a request path (no label per model name or unknown path)."""
    if path.startswith("/admin/"):
        return "/admin"
    if path.startswith("/v1/models"):
        return "/v1/models"
    return path if path in ROUTES else "other"


class GatewayMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.requests = Counter("pygw_requests", "Answers sent, by route and HTTP status",
                                ("route", "status"), registry=self.registry)
        self.upstream_latency = Histogram("pygw_upstream_latency_seconds",
                                          "Upstream call: request sent to response headers",
                                          buckets=_UPSTREAM_BUCKETS_S, registry=self.registry)
        self.overhead = Histogram("pygw_overhead_seconds", "pygw's own phases before the answer starts",
                                  buckets=_OVERHEAD_BUCKETS_S, registry=self.registry)
        self.retries = Counter("pygw_upstream_retries", "Upstream retries performed", registry=self.registry)

    def render(self) -> bytes:
        return generate_latest(self.registry)

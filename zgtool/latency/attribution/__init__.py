"""Attribution: what the engine and each gateway say about a request (per-engine adapters, Server-Timing,
OTLP spans, Prometheus deltas) and the join of those with the client's own phases."""

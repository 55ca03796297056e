"""What gateways say about themselves: their own latency headers and every Server-Timing entry, raw.

Keys are the lower-case header name, or the Server-Timing metric's own name; values in ms.
"""

from __future__ import annotations

from zgtool.latency.attribution.adapters.base import Evidence
from zgtool.latency.attribution.servertiming import server_timing_ms

# header -> factor to ms (all of these state ms)
HOP_HEADERS: dict[str, float] = {
    "x-litellm-overhead-duration-ms": 1.0,          # LiteLLM: from its handler start (docs: pre-handler wait unseen)
    "x-kong-proxy-latency": 1.0,                    # Kong: its own processing (kong/constants.lua PROXY_LATENCY)
    "x-kong-upstream-latency": 1.0,                 # Kong: waiting on the upstream
    "x-envoy-upstream-service-time": 1.0,           # Envoy: the upstream's time as Envoy saw it
    "x-mlflow-gateway-overhead-duration-ms": 1.0,   # MLflow AI Gateway (non-streaming only)
    "x-mlflow-gateway-duration-ms": 1.0,
}


def hop_reports(ev: Evidence) -> dict[str, float]:
    out: dict[str, float] = {}
    for name, factor in HOP_HEADERS.items():
        raw = ev.headers.get(name)
        if raw is None:
            continue
        try:
            v = float(raw.split(",")[0].strip()) * factor
        except ValueError:
            continue
        if v >= 0 and v == v:
            out[name] = v
    st = ev.headers.get("server-timing")
    if st:
        for k, v in server_timing_ms(st).items():
            out.setdefault(k, v)
    return out

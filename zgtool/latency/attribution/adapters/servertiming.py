"""zgtool's own engine: Server-Timing parts (header, or the zgtool-timing SSE comment on streams)."""

from __future__ import annotations

from zgtool.latency.attribution.adapters.base import Evidence
from zgtool.latency.attribution.adapters.units import SERVER_TIMING
from zgtool.latency.records import FROM_ARRIVAL, EngineTiming

SOURCE = SERVER_TIMING
SCALE_TO_MS = 1.0
_OTHER = ("detok", "safety")


def read(ev: Evidence) -> EngineTiming | None:
    st = ev.server_timing
    if "total" not in st and not any(k in st for k in ("queue", "prefill", "decode")):
        return None                # gw_* parts alone are a gateway's, not an engine's
    ttft = st.get("ttft")
    return EngineTiming(source=SOURCE, queue_ms=st.get("queue"), prefill_ms=st.get("prefill"),
                        decode_ms=st.get("decode"), total_ms=st.get("total"), ttft_ms=ttft,
                        ttft_start=FROM_ARRIVAL if ttft is not None else None, total_start=FROM_ARRIVAL,
                        other_ms={k: st[k] for k in _OTHER if k in st})

"""`openai-processing-ms` (OpenAI, and llama-cpp-python's server): the whole answer's processing time."""

from __future__ import annotations

from zgtool.latency.attribution.adapters.base import Evidence, number
from zgtool.latency.attribution.adapters.units import OPENAI
from zgtool.latency.records import FROM_ARRIVAL, EngineTiming

SOURCE = OPENAI
SCALE_TO_MS = 1.0


def read(ev: Evidence) -> EngineTiming | None:
    v = ev.header("openai-processing-ms")
    if v is None or ev.stream:
        return None     # on a stream the header is written before the first token: not the engine's total
    return EngineTiming(source=SOURCE, total_ms=number(v, "openai-processing-ms"), total_start=FROM_ARRIVAL)

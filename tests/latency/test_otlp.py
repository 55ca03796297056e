"""The OTLP/HTTP receiver against bytes the real OpenTelemetry Python exporter posted (fixtures/otlp,
recorded by fixtures/otlp/record_otlp.py) and against zgtool's engine's own span exporter."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from engine.server.tracing import SpanExporter, TraceContext, make_span
from zgtool.latency.attribution.otlp import (
    SOURCE,
    OtlpDecodeError,
    OtlpReceiver,
    SpanStore,
    attach_spans,
    decode,
    decode_json,
    decode_protobuf,
    parse_listen,
    span_timing,
)
from zgtool.latency.records import FROM_ARRIVAL, EngineTiming, RequestSample

FIX = Path(__file__).parent / "fixtures" / "otlp"
EXPECTED = json.loads((FIX / "expected.json").read_text())


def _check_against_expected(spans: list) -> None:
    assert len(spans) == 2
    by_name = {s.name: s for s in spans}
    for want in EXPECTED["spans"]:
        got = by_name[want["name"]]
        assert got.trace_id == want["trace_id"]
        assert got.parent_span_id == want["parent_span_id"]
        assert got.kind == want["kind"]
        assert len(got.span_id) == 16
        assert got.attributes == want["attributes"]
        assert got.end_ns >= got.start_ns
        assert got.service == "vllm"
        if "start_ns" in want:
            assert got.start_ns == want["start_ns"]
        if "trace_state" in want:
            assert got.trace_state == want["trace_state"]


def test_protobuf_body_of_the_real_exporter_decodes_every_field_the_join_needs() -> None:
    _check_against_expected(decode_protobuf((FIX / "otel_python_export.pb").read_bytes()))


def test_gzip_body_of_the_real_exporter_decodes_the_same() -> None:
    hdr = EXPECTED["headers_gzip"]
    spans = decode((FIX / "otel_python_export.pb.gz").read_bytes(), hdr["content-type"], hdr["content-encoding"])
    _check_against_expected(spans)


def test_otlp_json_of_the_same_message_decodes_the_same() -> None:
    _check_against_expected(decode_json((FIX / "otel_python_export.json").read_bytes()))


def test_vllm_span_attributes_become_engine_phases_in_ms_from_arrival() -> None:
    span = next(s for s in decode_protobuf((FIX / "otel_python_export.pb").read_bytes()) if s.name == "llm_request")
    t = span_timing(span)
    assert t is not None
    a = EXPECTED["spans"][0]["attributes"]
    assert t.source == SOURCE == "vLLM OTLP span"
    assert t.queue_ms == pytest.approx(a["gen_ai.latency.time_in_queue"] * 1000)
    assert t.prefill_ms == pytest.approx(a["gen_ai.latency.time_in_model_prefill"] * 1000)
    assert t.decode_ms == pytest.approx(a["gen_ai.latency.time_in_model_decode"] * 1000)
    assert t.total_ms == pytest.approx(a["gen_ai.latency.e2e"] * 1000)
    assert t.ttft_ms == pytest.approx(a["gen_ai.latency.time_to_first_token"] * 1000)
    assert t.ttft_start == t.total_start == FROM_ARRIVAL
    # what the scheduler phases leave of e2e is vLLM's frontend, named so the parts sum to the total
    assert t.other_ms == {"frontend": pytest.approx(203.1 - 1.25 - 35.2 - 161.8)}
    assert sum(t.phases().values()) == pytest.approx(t.total_ms)


def test_a_span_without_e2e_is_not_an_engine_timing_and_a_negative_one_is_refused() -> None:
    spans = decode_protobuf((FIX / "otel_python_export.pb").read_bytes())
    assert span_timing(next(s for s in spans if s.name == "unrelated")) is None
    doc = json.loads((FIX / "otel_python_export.json").read_text())
    span = next(s for s in doc["resourceSpans"][0]["scopeSpans"][0]["spans"] if s["name"] == "llm_request")
    for kv in span["attributes"]:
        if kv["key"] == "gen_ai.latency.time_in_model_decode":
            kv["value"] = {"doubleValue": -0.5}
    bad = next(s for s in decode_json(json.dumps(doc).encode()) if s.name == "llm_request")
    with pytest.raises(ValueError, match="time_in_model_decode"):
        span_timing(bad)


@pytest.mark.parametrize("body", [b"\x0a\x05\x01", b"\x0a\x80", b"\x0f"])
def test_broken_protobuf_is_a_decode_error(body: bytes) -> None:
    with pytest.raises(OtlpDecodeError):
        decode_protobuf(body)


def _post(url: str, body: bytes, headers: dict[str, str]) -> tuple[int, bytes, str]:
    req = urllib.request.Request(url, data=body, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, resp.read(), resp.headers.get("Content-Type", "")
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read(), exc.headers.get("Content-Type", "")


def test_receiver_answers_each_encoding_like_a_collector_and_keeps_the_spans() -> None:
    with OtlpReceiver() as rx:
        status, body, ctype = _post(rx.url, (FIX / "otel_python_export.pb.gz").read_bytes(),
                                    {"Content-Type": "application/x-protobuf", "Content-Encoding": "gzip"})
        assert (status, body, ctype) == (200, b"", "application/x-protobuf")
        status, body, ctype = _post(rx.url, (FIX / "otel_python_export.json").read_bytes(),
                                    {"Content-Type": "application/json"})
        assert (status, json.loads(body), ctype) == (200, {}, "application/json")
        tid = EXPECTED["spans"][0]["trace_id"]
        assert rx.store.wait_for([tid], 0.0) == set()
        assert len(rx.store.spans(tid)) == 2
        assert rx.store.received == 4
        assert _post(rx.url, b"\x0a\x80", {"Content-Type": "application/x-protobuf"})[0] == 400
        assert _post(rx.url, b"x", {"Content-Type": "text/plain"})[0] == 415
        assert _post(rx.url.replace("/v1/traces", "/v1/logs"), b"{}", {"Content-Type": "application/json"})[0] == 404
        assert rx.store.rejected_posts == 2


def test_spans_from_zgtools_engine_exporter_reach_the_receiver_in_the_callers_trace() -> None:
    ctx = TraceContext("0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331", 1, "zgtool=x")
    attrs = {"gen_ai.latency.time_in_queue": 0.001, "gen_ai.latency.time_in_model_prefill": 0.01,
             "gen_ai.latency.time_in_model_decode": 0.05, "gen_ai.latency.e2e": 0.062,
             "gen_ai.latency.time_to_first_token": 0.012}
    with OtlpReceiver() as rx:
        exp = SpanExporter(rx.url, "test")
        exp.submit(make_span(ctx, "llm_request", 1_000, 62_001_000, attrs))
        exp.close()
        assert rx.store.wait_for([ctx.trace_id], 10.0) == set()
        (span,) = rx.store.spans(ctx.trace_id)
    assert span.parent_span_id == ctx.parent_span_id
    t = span_timing(span)
    assert t is not None and t.total_ms == pytest.approx(62.0) and t.decode_ms == pytest.approx(50.0)


def _sample(i: int, trace_id: str, total_ms: float) -> RequestSample:
    return RequestSample(index=i, worker=0, round=0, ok=True, total_ms=total_ms, trace_id=trace_id)


def test_attach_fills_untimed_requests_and_counts_spans_that_do_not_fit() -> None:
    store = SpanStore()
    store.add(decode_protobuf((FIX / "otel_python_export.pb").read_bytes()))
    tid = EXPECTED["spans"][0]["trace_id"]
    fits, too_short = _sample(0, tid, 250.0), _sample(1, tid, 195.0)   # vLLM's e2e is 203.1 ms
    in_band = _sample(2, tid, 250.0)
    in_band.engine = EngineTiming(source="vLLM per-request metrics", total_ms=200.0)
    absent = _sample(3, "ffffffffffffffffffffffffffffffff", 250.0)
    missing = attach_spans([fits, too_short, in_band, absent], store, wait_s=0.0)
    assert missing == 1
    assert fits.engine is not None and fits.engine.source == SOURCE and fits.engine_warnings == []
    assert too_short.engine is None
    assert too_short.engine_warnings == [f"{SOURCE}: total_ms exceeds the client's total"]
    assert in_band.engine.source == "vLLM per-request metrics"
    # a request whose trace got no span is counted, never silently untimed
    assert absent.engine is None and absent.engine_warnings == [
        f"{SOURCE}: no span for the request's trace arrived within 0 s"]


def test_wait_for_returns_when_the_span_arrives_from_another_thread() -> None:
    import threading

    store = SpanStore()
    spans = decode_protobuf((FIX / "otel_python_export.pb").read_bytes())
    t = threading.Thread(target=store.add, args=(spans,))
    t.start()
    assert store.wait_for([EXPECTED["spans"][0]["trace_id"]], 30.0) == set()
    t.join()


@pytest.mark.parametrize(("spec", "want"), [("auto", ("127.0.0.1", 0)), ("4318", ("127.0.0.1", 4318)),
                                            ("0.0.0.0:4318", ("0.0.0.0", 4318)), ("[::1]:9", ("::1", 9))])
def test_listen_spec(spec: str, want: tuple[str, int]) -> None:
    assert parse_listen(spec) == want


@pytest.mark.parametrize("spec", ["x", "70000", "h:p"])
def test_bad_listen_spec_is_refused(spec: str) -> None:
    with pytest.raises(ValueError):
        parse_listen(spec)


def test_a_closed_receiver_keeps_no_exporters_connection_so_the_next_one_on_its_port_gets_the_spans() -> None:
    """An exporter keeps its HTTP connection alive between batches (the OpenTelemetry SDK's and vLLM's do). A
    receiver closed while that connection was open kept answering on it from its handler thread, so the next
    receiver on the same port (the next latency-split run against the same engine) never saw a span."""
    import http.client

    body = (FIX / "otel_python_export.json").read_bytes()
    headers = {"Content-Type": "application/json"}
    tid = EXPECTED["spans"][0]["trace_id"]
    first = OtlpReceiver().start()
    port = first.port
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("POST", "/v1/traces", body, headers)
        assert conn.getresponse().read() == b"{}"
        assert len(first.store.spans(tid)) == 1
        first.close()
        with OtlpReceiver(port=port) as second:
            try:                 # the old connection is gone: an exporter's retry connects anew, to the new one
                conn.request("POST", "/v1/traces", body, headers)
                conn.getresponse().read()
            except (ConnectionError, http.client.HTTPException):
                conn.close()
                conn.request("POST", "/v1/traces", body, headers)
                assert conn.getresponse().read() == b"{}"
            assert len(second.store.spans(tid)) == 1
        assert len(first.store.spans(tid)) == 1
    finally:
        conn.close()

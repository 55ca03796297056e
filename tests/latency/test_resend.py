"""A request that went out on a kept-alive connection the server had already closed is resent once on a new
connection, as a browser does, and the run says so; a request that fails on a new connection is not resent.

The server is sse_script_server.py: its /closing/ path closes the connection when the next request on it arrives,
unanswered, as llama-server closes its connection after every streamed answer while advertising keep-alive
(seen here: 4 of 30 streamed requests failed against it, every second one on a raw keep-alive client)."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator

import pytest
from replay_servers import sse_script_server

from zgtool.latency.analysis.phases import analyse
from zgtool.latency.config import SplitConfig
from zgtool.latency.render.split import _title
from zgtool.latency.wire.client import Endpoint, Session
from zgtool.targets import Target


@pytest.fixture(scope="module")
def server() -> Iterator[tuple[str, subprocess.Popen[str]]]:
    with sse_script_server(0) as running_server:
        yield running_server


def _lines(proc: subprocess.Popen[str], n: int) -> list[str]:
    return [(proc.stdout.readline() if proc.stdout else "").split(" ")[0] for _ in range(n)]


def test_a_request_on_a_connection_the_server_closed_is_resent_on_a_new_one(
        server: tuple[str, subprocess.Popen[str]]) -> None:
    url, proc = server
    cfg = SplitConfig(num_requests=4, warmup=0, stream=True, max_tokens=8, resamples=100)
    target = Target("closing", f"{url}/closing/role_first/v1", api="openai")
    session = Session(Endpoint.build(target, cfg), cfg, None)
    try:
        samples = [session.measure(i, 0, i, 0) for i in range(4)]
    finally:
        session.close()
    assert all(s.ok and s.output_tokens for s in samples), [(s.error, s.error_detail) for s in samples]
    # the server's own account: answered, then each later request dropped once and answered on a new connection
    assert _lines(proc, 7) == ["SENT", "DROPPED", "SENT", "DROPPED", "SENT", "DROPPED", "SENT"]
    assert samples[0].resent_after is None
    assert [s.resent_after for s in samples[1:]] == ["transport_error:RemoteProtocolError"] * 3
    assert all(s.new_connection and s.connect_ms is not None for s in samples[1:])   # its connect is in it
    res = analyse([target], [samples], cfg)
    assert any("3 of 4 requests went out on a kept-alive connection the server had already closed" in n
               and "502" in n for n in res.attribution_notes), res.attribution_notes
    assert _title(res.targets[0], res, "closing").endswith("ok 4/4, 3 resent")


def test_a_request_that_fails_on_a_new_connection_is_not_resent(server: tuple[str, subprocess.Popen[str]]) -> None:
    url, proc = server
    cfg = SplitConfig(num_requests=1, warmup=0, stream=True, max_tokens=8, resamples=100)
    session = Session(Endpoint.build(Target("drop", f"{url}/drop/role_first/v1", api="openai"), cfg), cfg, None)
    try:
        sample = session.measure(0, 0, 0, 0)
        assert not sample.ok and sample.error is not None and sample.error.startswith("transport_error:")
        assert sample.new_connection and sample.resent_after is None
        ok = session.measure(1, 0, 1, 0)       # the next request: its own new connection, dropped once only
    finally:
        session.close()
    assert _lines(proc, 2) == ["DROPPED", "DROPPED"] and not ok.ok and ok.resent_after is None


def test_502s_from_a_hop_in_front_of_llama_server_are_explained() -> None:
    """nginx in front of llama-server here answered 1 to 4 of 30 streams 502: it sent them into a kept-alive
    connection llama-server had closed. A path whose answers carry llama.cpp's timings says so; another does not."""
    from zgtool.latency.analysis.phases import resent_notes
    from zgtool.latency.attribution.adapters.units import LLAMACPP, VLLM
    from zgtool.latency.records import EngineTiming, RequestSample

    def path(source: str, events: int = 5) -> list[RequestSample]:
        ok = [RequestSample(index=i, worker=0, round=i, ok=True, total_ms=100.0, content_events=events,
                            engine=EngineTiming(source=source, total_ms=90.0)) for i in range(8)]
        return ok + [RequestSample(index=8 + i, worker=0, round=8 + i, ok=False, error="http_502") for i in range(2)]

    (note,) = resent_notes([Target("nginx", "http://127.0.0.1:1")], [path(LLAMACPP)])
    assert note.startswith("nginx: 2 of 10 requests were answered 502 by a hop in front of llama-server")
    assert "non_idempotent" in note
    assert resent_notes([Target("nginx", "http://127.0.0.1:1")], [path(VLLM)]) == []
    assert resent_notes([Target("nginx", "http://127.0.0.1:1")], [path(LLAMACPP, events=0)]) == []   # whole answers


def test_litellms_500s_in_front_of_llama_server_are_explained_from_the_direct_paths_streams() -> None:
    """LiteLLM 1.110 in front of llama-server here answered 1 of 30 streams 500 "OpenAIException - Connection error"
    (the same closed connection as nginx's 502). Its streams lose llama.cpp's timings, so the engine is known from
    the direct path's; a 500 that names no connection error gets no such note."""
    from zgtool.latency.analysis.phases import resent_notes
    from zgtool.latency.attribution.adapters.units import LLAMACPP
    from zgtool.latency.records import EngineTiming, RequestSample

    direct = [RequestSample(index=i, worker=0, round=i, ok=True, total_ms=100.0, content_events=5,
                            engine=EngineTiming(source=LLAMACPP, total_ms=90.0)) for i in range(10)]

    def through(detail: str) -> list[RequestSample]:
        ok = [RequestSample(index=i, worker=0, round=i, ok=True, total_ms=130.0, content_events=5) for i in range(9)]
        return ok + [RequestSample(index=9, worker=0, round=9, ok=False, error="http_500:internal_server_error",
                                   error_detail=detail)]

    targets = [Target("direct", "http://127.0.0.1:1"), Target("litellm", "http://127.0.0.1:2")]
    detail = ("litellm.InternalServerError: InternalServerError: OpenAIException - Connection error. LiteLLM: "
              "model group 'smollm2' failed with the error above. No fallback was attempted.")
    (note,) = resent_notes(targets, [direct, through(detail)])
    assert note.startswith("litellm: 1 of 10 requests were answered 500 by a hop in front of llama-server")
    assert "LiteLLM with num_retries >= 1" in note
    assert resent_notes(targets, [direct, through("litellm.BadRequestError: the prompt is too long")]) == []

"""probe stream: paced SSE from a real origin, direct and through real nginx (streaming and buffered)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from probe_servers import FakeOrigin, Nginx, OriginConfig, ThreadedUvicorn

from zgtool.probes.stream import Event, SSEParser, judge, probe_stream
from zgtool.targets import resolve


def test_direct_stream_with_emission_times_is_streaming(origin: ThreadedUvicorn) -> None:
    r = probe_stream(resolve(origin.url))
    assert r.status == 200 and "event-stream" in r.content_type
    assert r.num_content_events == 12 and r.content_bytes == 12 * len("token ")
    assert r.emission is not None and r.emission.source == "token_times_ms" and r.emission.span_ms > 100
    assert r.buffering.verdict == "streaming" and not r.buffering.buffered
    assert r.buffering.arrival_span_ms > 0.5 * r.emission.span_ms


def test_nginx_streaming_passes_the_stream_through(nginx: Nginx) -> None:
    r = probe_stream(resolve(f"http://127.0.0.1:{nginx.streaming}"))
    assert r.buffering.verdict == "streaming" and not r.buffering.buffered


def test_nginx_buffered_is_flagged_as_buffering_with_the_figures(nginx: Nginx) -> None:
    r = probe_stream(resolve(f"http://127.0.0.1:{nginx.buffered}"))
    b = r.buffering
    assert b.verdict == "buffering" and b.buffered
    assert b.emission_span_ms is not None and b.arrival_span_ms < 0.25 * b.emission_span_ms
    assert "held them back" in b.reason
    assert r.num_content_events == 12  # the content itself is intact


def test_without_emission_times_buffering_is_found_from_arrivals_alone(
        origin_without_times: ThreadedUvicorn, nginx_without_times: Nginx) -> None:
    direct = probe_stream(resolve(origin_without_times.url))
    buffered = probe_stream(resolve(f"http://127.0.0.1:{nginx_without_times.buffered}"))
    assert direct.emission is None and direct.buffering.verdict == "streaming"
    assert buffered.buffering.verdict == "buffering"
    assert buffered.buffering.burst_fraction == 1.0 and buffered.buffering.silence_before_burst_ms >= 20


def test_openai_streams_are_parsed_too(origin: ThreadedUvicorn) -> None:
    r = probe_stream(resolve(origin.url, api="openai"))
    assert r.path == "/v1/chat/completions" and r.num_content_events == 12
    assert r.buffering.verdict == "streaming"


def ev(t: float, n: int = 5, name: str = "content_block_delta") -> Event:
    return Event(t, name, n)


@pytest.mark.parametrize(("events", "first_body", "verdict"), [
    # a fast answer in one burst with nothing to compare: cannot tell
    ([ev(1.0), ev(1.1), ev(1.2)], 0.5, "inconclusive"),
    # too few content events
    ([ev(100.0)], 100.0, "inconclusive"),
    # slow prefill, then fast tokens; message_start came early: streamed as produced
    ([ev(0.5, 0, "message_start"), ev(400.0), ev(400.5), ev(401.0)], 0.5, "streaming"),
    # everything, message_start included, after a long silence: buffering
    ([ev(300.0, 0, "message_start"), ev(300.0), ev(300.0), ev(300.1)], 300.0, "buffering"),
    # paced arrivals
    ([ev(10.0 * i) for i in range(1, 8)], 10.0, "streaming"),
])
def test_judge_without_emission_times(events: list[Event], first_body: float, verdict: str) -> None:
    assert judge(events, first_body, 0.3, None).verdict == verdict


def test_sse_parser_handles_events_split_across_reads_and_crlf() -> None:
    p = SSEParser()
    assert p.feed("event: a\r\ndata: {\"x\"") == []
    assert p.feed(":1}\r") == []
    assert p.feed("\n: comment\r\n\r\ndata: b\n\n") == [("a", '{"x":1}'), ("message", "b")]


@pytest.fixture(scope="module")
def padded_hold() -> Iterator[ThreadedUvicorn]:
    with ThreadedUvicorn(FakeOrigin(OriginConfig(tokens=20, emit_times=False, shape="padded_hold"))) as srv:
        yield srv


@pytest.fixture(scope="module")
def late_burst() -> Iterator[ThreadedUvicorn]:
    with ThreadedUvicorn(FakeOrigin(OriginConfig(tokens=20, emit_times=False, shape="late_burst"))) as srv:
        yield srv


def test_paced_padding_does_not_hide_held_events(padded_hold: ThreadedUvicorn) -> None:
    r = probe_stream(resolve(padded_hold.url))
    b = r.buffering
    assert r.emission is None and r.num_content_events == 20
    assert r.first_body_ms is not None and r.first_body_ms < b.burst_start_ms  # bytes flowed before the events
    assert b.verdict == "buffering" and b.buffered, b.reason
    assert "the events were held" in b.reason and b.burst_fraction == 1.0


def test_a_late_start_then_a_fast_run_is_streaming_not_buffering(late_burst: ThreadedUvicorn) -> None:
    r = probe_stream(resolve(late_burst.url))
    b = r.buffering
    assert r.emission is None and r.num_content_events == 20
    assert r.first_content_ms is not None and r.first_content_ms >= 250  # nothing for 300 ms, then the run
    assert b.verdict == "streaming" and not b.buffered, b.reason
    # event by event, read by read: not one released buffer
    assert len({e.t_ms for e in r.events if e.content_bytes}) > 3


def test_probe_all_raises_a_silent_path_to_likely_when_the_stream_is_held(padded_hold: ThreadedUvicorn) -> None:
    from zgtool.probes.combined import probe_all

    r = probe_all(resolve(padded_hold.url), max_tokens=20)
    assert r.headers.analysis.verdict == "none"  # nothing in the headers names a hop
    assert r.summary["buffering"] == "buffering"
    assert r.summary["verdict"] == "likely" and r.summary["verdict_summary"] == "an intermediary is likely, unidentified"
    assert any(e.startswith("probe stream: ") for e in r.summary["evidence"])


def test_a_probes_clock_starts_before_the_requests_first_byte_leaves() -> None:
    """The probes time an answer from the request's start out, not from after sendall returned: a request whose
    body the server must read before sendall can return shows it, without timing anything (perf_counter is the
    same monotonic clock in both threads)."""
    import socket
    import threading
    import time

    from probes.http1 import Http1Connection

    srv = socket.create_server(("127.0.0.1", 0))
    first_in: list[float] = []

    def serve() -> None:
        conn, _ = srv.accept()
        got = conn.recv(65536)
        first_in.append(time.perf_counter())
        while b"\r\n\r\n" not in got or len(got) < 8 << 20:
            more = conn.recv(1 << 20)
            if not more:
                break
            got += more
        conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\nconnection: close\r\n\r\nok")
        conn.close()

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    try:
        c = Http1Connection(host="127.0.0.1", port=srv.getsockname()[1], tls=False, timeout_s=30, verify_tls=False)
        with c:
            c.connect()
            c.send_request("POST", "/", [("Host", "x")], b"a" * (8 << 20))      # more than the socket buffers
            head = c.read_head()
        t.join(10)
    finally:
        srv.close()
    assert head.status == 200 and first_in
    assert c.timings.request_out_s is not None and c.timings.request_out_s <= first_in[0]
    assert c.timings.first_byte_s is not None and c.timings.request_out_s < c.timings.first_byte_s

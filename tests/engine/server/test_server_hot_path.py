"""What the serving path spends per request and per token stays spent once (issue 34 item 6), checked
by counting, never by timing: no request leaves a reference cycle for the garbage collector, a
non-streaming answer wakes its handler once, a streamed token is one transport write of uvicorn's
own chunk bytes, and the per-token event bytes are json.dumps' bytes."""

from __future__ import annotations

import asyncio
import gc
import json
from typing import Any

import httpx
import pytest
from cycle_helpers import RecordingTransport, make_cycle
from uvicorn.protocols.http.httptools_impl import RequestResponseCycle
from zgtest import wait_until

from zgtool.engine.api import anthropic as anth
from zgtool.engine.api import openai as oai
from zgtool.engine.config import SamplingParams
from zgtool.engine.outputs import RequestOutput
from zgtool.engine.sequence import Sequence
from zgtool.engine.server.context import Ctx, Flight
from zgtool.engine.server.protocol import _OneWriteCycle
from zgtool.engine.stream import RequestStream

# the per-request objects of the serving path; any of them in a cycle is freed only by a collection
PER_REQUEST_TYPES = (RequestResponseCycle, Ctx, Flight, RequestStream)


def _requests(url: str) -> None:
    with httpx.Client(base_url=url, timeout=10) as c:
        for stream in (False, True):
            r = c.post("/v1/messages", json={"model": "null", "max_tokens": 4, "stream": stream,
                                             "messages": [{"role": "user", "content": "hi"}]})
            assert r.status_code == 200
            r = c.post("/v1/chat/completions", json={"model": "null", "max_tokens": 4, "stream": stream,
                                                     "messages": [{"role": "user", "content": "hi"}]})
            assert r.status_code == 200
        assert c.get("/health").status_code == 200
        assert c.post("/v1/messages", json={"model": "nope", "max_tokens": 4,
                                            "messages": [{"role": "user", "content": "hi"}]}).status_code == 404


def test_served_requests_leave_no_reference_cycle_for_the_collector(start_server: Any) -> None:
    with start_server() as s:
        _requests(s.url)                      # warm: first-use caches, lazily built objects
        s.wait_idle()
        gc.collect()
        gc.garbage.clear()
        gc.set_debug(gc.DEBUG_SAVEALL)        # what a collection finds unreachable is kept for us to see
        try:
            _requests(s.url)
            s.wait_idle()
            gc.collect()
            stuck = [type(o).__name__ for o in gc.garbage if isinstance(o, PER_REQUEST_TYPES)]
        finally:
            gc.set_debug(0)
            gc.garbage.clear()
    assert stuck == [], f"per-request objects freed only by the garbage collector: {stuck}"



def test_a_finished_stream_keeps_no_request_objects_alive(start_server: Any) -> None:
    # The keepalive ticker dropped a finished stream's watch at its next tick (0.5 s): at a high
    # request rate hundreds of finished requests (flight, stream, sequence, usage) stayed alive,
    # and their allocations set the collector off while serving. The watch now goes in the
    # stream's own cleanup, before the request leaves app.inflight.
    with start_server() as s:
        app = s.built.app
        _requests(s.url)
        wait_until(lambda: not app.inflight, 10, "the handlers' cleanup")
        assert app.keepalive.watches == set()

        def ours() -> list[str]:
            return [type(o).__name__ for o in gc.get_objects()
                    if (type(o) is Flight and o.rid.startswith(app._prefix))
                    or (type(o) is RequestStream and o.request_id.startswith(app._prefix))]

        wait_until(lambda: not ours(), 10, "the finished requests' objects to be freed")


class _CountingLoop:
    """Forwards to the running loop, counting the futures a stream's reader waits on."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.futures = 0

    def create_future(self) -> asyncio.Future[None]:
        self.futures += 1
        return self.loop.create_future()


@pytest.mark.parametrize(("wake_on_finish", "wakes"), [(True, 1), (False, 16)])
def test_a_whole_answer_reader_is_woken_once_not_once_per_step(wake_on_finish: bool, wakes: int) -> None:
    stream = RequestStream(Sequence("r", [1], SamplingParams(max_tokens=16)), None)
    stream.wake_on_finish = wake_on_finish
    got: list[str] = []

    async def main() -> int:
        loop = _CountingLoop(asyncio.get_running_loop())
        stream._loop = loop  # type: ignore[assignment]

        async def read() -> None:
            async for out in stream:
                got.append(out.text)

        reader = asyncio.create_task(read())
        for i in range(16):                    # one engine step per loop iteration
            await asyncio.sleep(0)
            stream.push(RequestOutput("r", [i], str(i % 10), finished=i == 15, finish_reason="length" if i == 15 else None))
        await reader
        return loop.futures

    assert asyncio.run(main()) == wakes
    assert "".join(got) == "".join(str(i % 10) for i in range(16))


def _started_stream(t: RecordingTransport, method: str = "POST", cls: type = _OneWriteCycle) -> Any:
    cycle = make_cycle(t, method=method, cls=cls)

    async def go() -> None:
        await cycle.send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/event-stream")]})
    asyncio.run(go())
    t.writes.clear()
    return cycle


@pytest.mark.parametrize("body", [b"data: 1\n\n", anth.text_delta("h\u00e9\n\"x\""), b"x" * 70000])
def test_a_streamed_token_is_one_write_of_uvicorns_own_chunk_bytes(body: bytes) -> None:
    ours = RecordingTransport()
    assert _started_stream(ours).write_chunk(body) is True
    theirs = RecordingTransport()
    cycle = _started_stream(theirs, cls=RequestResponseCycle)
    asyncio.run(cycle.send({"type": "http.response.body", "body": body, "more_body": True}))
    assert ours.writes == theirs.writes and len(ours.writes) == 1


def test_a_chunk_steps_aside_where_the_asgi_send_must_run() -> None:
    t = RecordingTransport()
    assert make_cycle(t).write_chunk(b"x") is False                 # not started
    head = _started_stream(RecordingTransport(), method="HEAD")     # HEAD: no body, not chunked
    assert head.write_chunk(b"x") is False
    paused = _started_stream(RecordingTransport())
    paused.flow.write_paused = True                                 # the ASGI send awaits the drain
    assert paused.write_chunk(b"x") is False
    gone = _started_stream(RecordingTransport())
    gone.disconnected = True
    assert gone.write_chunk(b"x") is False
    done = _started_stream(t2 := RecordingTransport())
    asyncio.run(done.send({"type": "http.response.body", "body": b"", "more_body": False}))
    t2.writes.clear()
    assert done.write_chunk(b"x") is False and t2.writes == []


@pytest.mark.parametrize("text", ["plain", "h\u00e9llo", "\u2028\u2029", "tab\tnl\ncr\r", "q\"b\\", "\x00\x1f\x7f",
                                  "\U0001f600", "\ud800", ""])
def test_per_token_events_are_json_dumps_bytes(text: str) -> None:
    assert anth.text_delta(text) == (b'event: content_block_delta\ndata: {"type":"content_block_delta","index":0,'
                                     b'"delta":{"type":"text_delta","text":' + json.dumps(text).encode() + b"}}\n\n")
    w = oai.ChunkWriter("chatcmpl-1", "null")
    line = w.content(text)
    assert line.startswith(b"data: ") and line.endswith(b"\n\n")
    assert json.loads(line[6:])["choices"][0]["delta"]["content"] == text
    assert b'"content":' + json.dumps(text).encode() + b"}" in line


def _with_body(body: bytes, more_body: bool = False) -> Any:
    cycle = make_cycle(RecordingTransport())
    cycle.body = bytearray(body)        # what on_body accumulates
    cycle.more_body = more_body
    cycle.message_event.set()          # as on_body / on_message_complete leave it
    return cycle


def test_a_complete_body_is_taken_once_as_receive_would_return_it() -> None:
    theirs = _with_body(b'{"model":"null"}')
    msg = asyncio.run(theirs.receive())
    ours = _with_body(b'{"model":"null"}')
    got = ours.whole_body(1 << 20)
    assert got == msg["body"] and type(got) is type(msg["body"]) is bytes and msg["more_body"] is False
    # taken: the cycle is left as receive() leaves it (body gone, event cleared)
    assert ours.body == theirs.body == b"" and ours.message_event.is_set() is theirs.message_event.is_set() is False


def test_the_body_is_left_to_receive_while_arriving_over_the_limit_or_owed_a_100_continue() -> None:
    arriving = _with_body(b'{"mo', more_body=True)
    assert arriving.whole_body(1 << 20) is None and arriving.body == b'{"mo'
    big = _with_body(b"x" * 101)
    assert big.whole_body(100) is None and big.body == b"x" * 101   # receive + read_body say 413
    owed = _with_body(b"{}")
    owed.waiting_for_100_continue = True
    assert owed.whole_body(1 << 20) is None and owed.body == b"{}"
    gone = _with_body(b"{}")
    gone.disconnected = True
    assert gone.whole_body(1 << 20) is None


SSE_HEAD = [(b"server", b"zgtool-engine/test"), (b"request-id", b"req_1"), (b"content-type", b"text/event-stream"),
            (b"cache-control", b"no-cache"), (b"x-accel-buffering", b"no")]


@pytest.mark.parametrize("keep_alive", [True, False])
@pytest.mark.parametrize("tail", [b"event: message_stop\ndata: {}\n\n", b""])
def test_a_stream_started_and_ended_at_once_writes_uvicorns_own_bytes(keep_alive: bool, tail: bytes) -> None:
    ours, theirs = RecordingTransport(), RecordingTransport()
    mine = make_cycle(ours, keep_alive=keep_alive)
    assert mine.start_chunked(200, list(SSE_HEAD)) is True
    assert mine.write_chunk(b"data: 1\n\n") is True
    assert mine.end_chunked(tail) is True
    cycle = make_cycle(theirs, keep_alive=keep_alive, cls=RequestResponseCycle)

    async def go() -> None:
        await cycle.send({"type": "http.response.start", "status": 200, "headers": list(SSE_HEAD)})
        await cycle.send({"type": "http.response.body", "body": b"data: 1\n\n", "more_body": True})
        await cycle.send({"type": "http.response.body", "body": tail, "more_body": False})
    asyncio.run(go())
    assert b"".join(ours.writes) == b"".join(theirs.writes) and len(ours.writes) == 3
    assert ours.closed is theirs.closed is (not keep_alive)
    assert mine.response_complete and mine.completed == [True] and mine.message_event.is_set()


def test_a_stream_start_steps_aside_where_uvicorns_send_must_run() -> None:
    assert make_cycle(RecordingTransport(), method="HEAD").start_chunked(200, list(SSE_HEAD)) is False
    assert make_cycle(RecordingTransport()).start_chunked(204, list(SSE_HEAD)) is False
    assert make_cycle(RecordingTransport()).start_chunked(200, [(b"content-length", b"3")]) is False
    assert make_cycle(RecordingTransport()).start_chunked(200, [(b"request-id", b"a\r\nb")]) is False
    paused = make_cycle(t := RecordingTransport())
    paused.flow.write_paused = True
    assert paused.start_chunked(200, list(SSE_HEAD)) is False and t.writes == [] and not paused.response_started
    assert _started_stream(RecordingTransport()).start_chunked(200, list(SSE_HEAD)) is False   # started already
    not_started = make_cycle(RecordingTransport())
    assert not_started.end_chunked(b"x") is False
    gone = _started_stream(RecordingTransport())
    gone.disconnected = True
    assert gone.end_chunked(b"x") is False and not gone.response_complete

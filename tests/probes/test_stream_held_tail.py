"""probe stream against a real hop that passes the first SSE event and holds the rest: the tail lands in one
write when the origin's answer ends (~70 ms later), while the first-to-last span still looks like the
origin's own emission span. It must be called buffering, with the server's emission times present or not;
the same hop passing everything through stays "streaming"."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator

import pytest
from probe_servers import FakeOrigin, OriginConfig, ThreadedUvicorn

from zgtool.probes.stream import probe_stream
from zgtool.targets import resolve

TOKENS = 64
TOKEN_DELAY_MS = 1.1          # 64 tokens over ~70 ms
RUNS = 5
TERMINATOR = b"0\r\n\r\n"


class HoldingHop:
    """A byte-level HTTP/1.1 hop on a free loopback port. Upstream -> client: with `hold`, the head and the
    first SSE event (to the end of its chunk) go through at once, everything after is kept and written in
    one write when the upstream's chunked answer ends; without it, every upstream read is passed on."""

    def __init__(self, upstream_port: int, *, hold: bool) -> None:
        self.upstream_port, self.hold = upstream_port, hold
        self.loop = asyncio.new_event_loop()
        self.ready = threading.Event()
        self.port = 0
        self.thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> HoldingHop:
        self.thread.start()
        assert self.ready.wait(30), "hop did not start"
        return self

    def __exit__(self, *exc: object) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=10)

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        server = self.loop.run_until_complete(asyncio.start_server(self._handle, "127.0.0.1", 0))
        self.port = server.sockets[0].getsockname()[1]
        self.ready.set()
        self.loop.run_forever()
        server.close()
        # connections the probe left open end here, on their loop: dropped with it, each handler's
        # coroutine was closed by the collector later and raised in its finally ("Exception ignored")
        pending = asyncio.all_tasks(self.loop)
        for task in pending:
            task.cancel()
        self.loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
        self.loop.close()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_r, up_w = await asyncio.open_connection("127.0.0.1", self.upstream_port)

        async def upstream() -> None:
            while data := await reader.read(65536):
                up_w.write(data)
                await up_w.drain()
            up_w.close()

        pump = asyncio.ensure_future(upstream())
        head, held, passed = b"", b"", False
        try:
            while data := await up_r.read(65536):
                if not self.hold:
                    writer.write(data)
                    await writer.drain()
                    continue
                if passed:
                    held += data
                else:
                    head += data
                    cut = _first_event_end(head)
                    if cut is None:
                        continue
                    writer.write(head[:cut])          # the head and the first event, at once
                    await writer.drain()
                    held, passed = head[cut:], True
                if held.endswith(TERMINATOR):
                    writer.write(held)                # the tail, in one write
                    await writer.drain()
                    held = b""
            if held:
                writer.write(held)
        finally:
            writer.close()
            up_w.close()
            pump.cancel()


def _first_event_end(buf: bytes) -> int | None:
    """Just past the first SSE event after the head, and the \\r\\n closing its chunk."""
    head_end = buf.find(b"\r\n\r\n")
    if head_end < 0:
        return None
    end = buf.find(b"\n\n", head_end + 4)
    if end < 0:
        return None
    end += 2
    return end + 2 if buf[end:end + 2] == b"\r\n" else end


@pytest.fixture(scope="module", params=[True, False], ids=["emission-times", "no-emission-times"])
def paced_origin(request: pytest.FixtureRequest) -> Iterator[ThreadedUvicorn]:
    cfg = OriginConfig(tokens=TOKENS, token_delay_ms=TOKEN_DELAY_MS, emit_times=request.param)
    with ThreadedUvicorn(FakeOrigin(cfg)) as srv:
        yield srv


def test_a_hop_that_passes_the_first_event_and_holds_the_tail_is_buffering(paced_origin: ThreadedUvicorn) -> None:
    with HoldingHop(paced_origin.port, hold=True) as hop:
        results = [probe_stream(resolve(f"http://127.0.0.1:{hop.port}", api="openai")) for _ in range(RUNS)]
    for r in results:
        b = r.buffering
        assert r.num_content_events == TOKENS, r.num_content_events
        assert b.verdict == "buffering" and b.buffered, b.reason
        assert b.burst_fraction is not None and b.burst_fraction >= (TOKENS - 1) / TOKENS - 1e-3
    verdicts = [r.buffering.verdict for r in results]
    assert verdicts == ["buffering"] * RUNS


def test_the_same_hop_passing_every_read_through_is_streaming(paced_origin: ThreadedUvicorn) -> None:
    with HoldingHop(paced_origin.port, hold=False) as hop:
        r = probe_stream(resolve(f"http://127.0.0.1:{hop.port}", api="openai"))
    assert r.num_content_events == TOKENS
    if r.emission is not None:
        assert r.buffering.verdict == "streaming", r.buffering.reason
    else:
        # 1.1 ms apart and nothing to compare with: never "buffering"
        assert r.buffering.verdict in ("streaming", "inconclusive"), r.buffering.reason

"""A stream's events whose deltas were queued together leave in one write (engine/server/handlers.py's
_stream): the same events, in the same order, as one write per token, in fewer writes. Driven in process
through the real protocol class, app and engine (bench/serving_inproc.py's stand-in connection), with
the loop driver's time budget per tick set so that every step gets its own tick (one delta per wake-up)
or all steps share one (every delta queued at once): counted, never timed."""

from __future__ import annotations

import asyncio
import json
import logging
import sys
from pathlib import Path

import pytest

from zgtool.engine import drivers
from zgtool.http.sse import SSEParser

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "bench"))
import serving_inproc  # noqa: E402

TOKENS = 16


def _streamed(monkeypatch: pytest.MonkeyPatch, tick_budget_s: float, api: str) -> list[bytes]:
    import uvloop

    monkeypatch.setattr(drivers, "TICK_BUDGET_S", tick_budget_s)
    path, body = ("/v1/messages", {"model": "null", "max_tokens": TOKENS, "stream": True,
                                   "messages": [{"role": "user", "content": "hi"}]})
    if api == "openai":
        path = "/v1/chat/completions"
    data = json.dumps(body).encode()
    raw = (b"POST %s HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s"
           % (path.encode(), len(data), data))
    writes: list[bytes] = []

    class Recording(serving_inproc._Conn):
        def got(self, data: bytes) -> None:
            writes.append(data)
            super().got(data)

    logging.disable(logging.WARNING)
    built, server = serving_inproc.null_server()
    try:
        async def go() -> None:
            make = serving_inproc.start_serving(built, server, asyncio.get_running_loop())
            conn = Recording(raw, True, [0])
            conn.proto = make()
            conn.proto.connection_made(serving_inproc._Transport(conn))
            conn.proto.data_received(raw)
            while conn.answers == 0:
                await asyncio.sleep(0)
            conn.proto.connection_lost(None)
            await built.engine.shutdown(1.0)

        uvloop.run(go())
    finally:
        built.sock.close()
        logging.disable(logging.NOTSET)
    return writes


def _events(writes: list[bytes]) -> list[tuple[str | None, str]]:
    """The answer's SSE events (chunked framing undone), ids and timings left out: they differ per request."""
    raw = b"".join(writes)
    body, rest = b"", raw.split(b"\r\n\r\n", 1)[1]
    while True:
        size_line, rest = rest.split(b"\r\n", 1)
        size = int(size_line, 16)
        if size == 0:
            break
        body, rest = body + rest[:size], rest[size + 2:]
    out = []
    for e in SSEParser().feed(body):
        if not e.data or e.data == "[DONE]":
            continue
        d = json.loads(e.data)
        if "delta" in d or "choices" in d:
            delta = d.get("delta") or (d["choices"][0].get("delta") if d.get("choices") else None)
            out.append((e.event, json.dumps(delta, sort_keys=True)))
    return out


@pytest.mark.parametrize("api", ["anthropic", "openai"])
def test_deltas_queued_together_leave_in_one_write_as_the_same_events(monkeypatch: pytest.MonkeyPatch,
                                                                      api: str) -> None:
    apart = _streamed(monkeypatch, 0.0, api)          # one step per tick: one delta per wake-up
    together = _streamed(monkeypatch, 60.0, api)      # every step in one tick: the deltas queue up
    texts = [d for _, d in _events(apart) if '"text"' in d or '"content"' in d]
    assert len(texts) >= TOKENS - 1                      # one event per token (the last may ride in the tail)
    assert _events(together) == _events(apart)            # the same events, in the same order
    assert len(apart) >= TOKENS                           # a write per token when each comes alone
    assert len(together) <= 4                             # head, first token, the queued rest, the tail

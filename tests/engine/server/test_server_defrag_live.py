"""`zgtool defrag` end to end: the real CLI against a live engine with running streams."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from contextlib import ExitStack
from typing import Any

MSGS = [{"role": "user", "content": "hello"}]


def open_stream(srv: Any, stack: ExitStack, key: str, max_tokens: int = 900) -> socket.socket:
    """A long stream, admitted and producing tokens; closing the socket disconnects it."""
    body = json.dumps({"model": "default", "max_tokens": max_tokens, "stream": True,
                       "ignore_eos": True, "messages": MSGS}).encode()
    s = stack.enter_context(socket.create_connection(("127.0.0.1", srv.port)))
    s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              + b"Authorization: Bearer " + key.encode() + b"\r\n" + b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
    got = b""
    while got.count(b'"content"') < 2:
        chunk = s.recv(65536)
        assert chunk, got
        got += chunk
    return s


def test_defrag_cli_compacts_a_fragmented_live_pool_without_touching_running_streams(
        start_server: Any, keys_file: Any, api_keys: dict[str, str]) -> None:
    with start_server(model="dummy:tiny", keys=keys_file) as srv, ExitStack() as keep:
        engine = srv.built.engine
        gone = ExitStack()
        socks = []
        for i in range(6):
            socks.append(open_stream(srv, gone if i % 2 == 0 else keep, api_keys["pro"]))
        time.sleep(0.3)  # decodes grow every table block by block: their blocks interleave
        gone.close()     # disconnect alternate streams: their blocks are freed, leaving holes
        deadline = time.time() + 5
        while engine.stats()["running"] != 3 and time.time() < deadline:
            time.sleep(0.02)
        assert engine.stats()["running"] == 3
        proc = subprocess.run(
            [sys.executable, "-m", "zgtool", "defrag", "--engine", srv.url, "--admin-key", api_keys["admin"],
             "--json"], capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0, proc.stderr
        data = json.loads(proc.stdout)["data"]
        blob = json.dumps(data)
        before, after = _find(data, "before"), _find(data, "after")
        assert before["fragmentation"] > 0, blob
        assert after["fragmentation"] == 0, blob
        # nothing in use was freed: the three streams still hold blocks and keep running
        assert after["kv_blocks_used"] >= 3 and engine.stats()["running"] == 3
        for s in socks[1::2]:
            s.settimeout(10)
            assert s.recv(65536)  # still streaming after the move
    assert engine.stats()["kv_blocks_used"] == 0


def _find(obj: Any, key: str) -> dict[str, Any]:
    """The before/after report wherever the result nests it."""
    if isinstance(obj, dict):
        if key in obj and isinstance(obj[key], dict) and "fragmentation" in obj[key]:
            return obj[key]
        for v in obj.values():
            try:
                return _find(v, key)
            except KeyError:
                continue
    raise KeyError(key)

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


def wait_until(pred: Any, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not pred():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


# The real CLI, its imports done before the streams start: on a loaded machine an interpreter's
# start-up takes seconds, longer than a stream lives. It runs `zgtool defrag` when told to.
PRIMED_CLI = ("import sys\nfrom zgtool.app import main\nimport zgtool.commands.dcgm, zgtool.dcgm.defrag, "
              "zgtool.dcgm.render, httpx\nprint('READY', flush=True)\nsys.stdin.readline()\nmain(sys.argv[1:])\n")


def test_defrag_cli_compacts_a_fragmented_live_pool_without_touching_running_streams(
        start_server: Any, keys_file: Any, api_keys: dict[str, str]) -> None:
    with start_server(model="dummy:small", keys=keys_file, grace_s=1) as srv, ExitStack() as keep:
        # dummy:small, not tiny: tiny decodes 900 tokens faster than the CLI can ask, and the kept
        # streams must still be running when the defrag request arrives
        engine = srv.built.engine
        cli = subprocess.Popen([sys.executable, "-c", PRIMED_CLI, "defrag", "--engine", srv.url, "--admin-key",
                                api_keys["admin"], "--json"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
        keep.callback(lambda: cli.poll() is None and cli.kill())
        assert cli.stdout is not None and cli.stdout.readline().strip() == "READY", cli.stderr
        gone = ExitStack()
        socks = []
        for i in range(6):
            socks.append(open_stream(srv, gone if i % 2 == 0 else keep, api_keys["pro"]))
        # decodes grow every table block by block, in turn: once each of the six streams holds two
        # blocks past its prompt's, their blocks interleave
        blocks_at_start = engine.stats()["kv_blocks_used"]
        wait_until(lambda: engine.stats()["kv_blocks_used"] >= blocks_at_start + 6 * 2, 60, "interleaved blocks")
        gone.close()     # disconnect alternate streams: their blocks are freed, leaving holes
        wait_until(lambda: engine.stats()["running"] == 3, 10, "the three disconnected streams to be freed")
        out, err = cli.communicate("go\n", timeout=60)
        assert cli.returncode == 0, err
        data = json.loads(out)["data"]
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

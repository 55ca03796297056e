"""`python -m zgtool serve` as a process: start-up table, health, graceful SIGTERM, CLI errors."""

from __future__ import annotations

import json
import signal
import socket
import ssl
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from engine_live import child

ZGTOOL = [sys.executable, "-m", "zgtool"]


def test_startup_table_health_and_sigterm_finishes_the_in_flight_stream_then_exits_0(
        serve_proc: Any, tmp_path: Path) -> None:
    log = tmp_path / "serve.log"
    # dummy:tiny costs a real forward per token, so the stream is surely in flight at SIGTERM
    with serve_proc("--model", "dummy:tiny", "--grace-s", "20", log=log) as (proc, url):
        out = log.read_text()
        for row in ("model", "device", "dtype", "KV pool", "listening", "/v1/messages", "OPEN: no --keys"):
            assert row in out, out
        assert httpx.get(url + "/health").json() == {"status": "ok"}
        port = int(url.rsplit(":", 1)[1])
        body = json.dumps({"model": "default", "max_tokens": 300, "stream": True, "ignore_eos": True,
                           "stream_options": {"include_usage": True},
                           "messages": [{"role": "user", "content": "hi"}]}).encode()
        with socket.create_connection(("127.0.0.1", port)) as s:
            s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                      b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
            data = s.recv(65536)
            assert data.startswith(b"HTTP/1.1 200")
            proc.send_signal(signal.SIGTERM)
            s.settimeout(30)
            while chunk := s.recv(1 << 20):
                data += chunk
        assert b"data: [DONE]" in data                       # the in-flight stream completed
        assert b'"completion_tokens":300' in data
        assert proc.wait(30) == 0


def test_tls_self_signed_prints_the_fingerprint_and_serves_https(serve_proc: Any, tmp_path: Path) -> None:
    log = tmp_path / "serve.log"
    with serve_proc("--tls", "self-signed", "--tls-dir", str(tmp_path / "tls"), log=log) as (_, url):
        out = log.read_text()
        assert "TLS sha256" in out and url.startswith("https://")
        r = httpx.get(url + "/health", verify=ssl.create_default_context(cafile=str(tmp_path / "tls" / "cert.pem")))
        assert r.status_code == 200


def test_a_self_signed_key_made_without_tls_dir_is_removed_when_the_server_stops(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setenv("TMPDIR", str(scratch))       # where the child's temporary folders go
    with child(tmp_path, "--tls", "self-signed", keyed=False) as live:
        assert live.proc is not None
        made = list(scratch.glob("zgtool-tls-*"))
        assert len(made) == 1 and (made[0] / "key.pem").exists()
        ctx = ssl.create_default_context(cafile=str(made[0] / "cert.pem"))
        assert httpx.get(live.url + "/health", verify=ctx).status_code == 200
        live.proc.send_signal(signal.SIGTERM)
        assert live.proc.wait(30) == 0
    assert list(scratch.iterdir()) == []              # no private key left behind


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*ZGTOOL, "serve", "--model", "null", *args], capture_output=True, text=True, timeout=60)


def test_bad_flags_exit_2_with_one_line(tmp_path: Path) -> None:
    for args, fragment in ((("--tls", "bogus"), "--tls must be"),
                           (("--keys", str(tmp_path / "absent.toml")), "does not exist"),
                           (("--safety-policy", str(tmp_path / "absent.toml")), "does not exist"),
                           (("--stream-interval", "0"), "--stream-interval must be >= 1")):
        r = _run(*args)
        assert r.returncode == 2, r.stderr
        assert fragment in r.stderr and "Traceback" not in r.stderr


def test_unknown_model_exits_2_naming_it() -> None:
    r = subprocess.run([*ZGTOOL, "serve", "--model", "no-such-model", "--port", "0"], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 2 and "no-such-model" in r.stderr and "Traceback" not in r.stderr


def test_a_taken_port_exits_2_before_loading_the_model() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        t0 = time.monotonic()
        r = _run("--port", str(taken.getsockname()[1]))
    assert r.returncode == 2 and "cannot listen on" in r.stderr
    assert time.monotonic() - t0 < 60

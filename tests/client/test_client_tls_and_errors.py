"""`client ask`, `defrag` and `dcgm watch` reach `serve --tls self-signed` with --cacert/--insecure; a
certificate failure and a 501 are never retried; an HTML error page is reduced to its message."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from scripted_llm_server import ScriptedServer, Step
from zgtest import run_zgtool, wait_until

from zgtool.http.net import free_port


@pytest.fixture(scope="module")
def tls_engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    tls_dir = tmp_path_factory.mktemp("tls")
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "zgtool", "serve", "--model", "dummy:tiny", "--port", str(port),
                             "--tls", "self-signed", "--tls-dir", str(tls_dir)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"https://127.0.0.1:{port}"

    def up() -> bool:
        try:
            return httpx.get(url + "/health", verify=False, timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    try:
        wait_until(lambda: up() or proc.poll() is not None, 120, "the TLS engine")
        assert proc.poll() is None, "zgtool serve --tls self-signed exited"
        yield url, tls_dir / "cert.pem"
    finally:
        proc.terminate()
        proc.wait(timeout=20)


def test_ask_a_self_signed_engine_fails_once_naming_cacert_and_works_with_it(tls_engine, tmp_path: Path):
    url, cert = tls_engine
    out = tmp_path / "ask.json"
    proc = run_zgtool("client", "ask", url, "hello", "--max-tokens", "2", "-o", out)
    assert proc.returncode == 3, proc.stderr
    assert "certificate did not verify" in proc.stderr and "--cacert" in proc.stderr
    assert json.loads(out.read_text())["data"]["num_attempts"] == 1  # the same certificate on every retry
    assert run_zgtool("client", "ask", url, "hello", "--max-tokens", "2", "--cacert", cert).returncode == 0
    assert run_zgtool("client", "ask", url, "hello", "--max-tokens", "2", "--insecure").returncode == 0


def test_defrag_reaches_a_self_signed_engine_with_cacert(tls_engine):
    url, cert = tls_engine
    bad = run_zgtool("defrag", "--engine", url, "--dry-run")
    assert bad.returncode == 3 and "--cacert" in bad.stderr
    ok = run_zgtool("defrag", "--engine", url, "--dry-run", "--cacert", cert, "--json")
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout)["kind"] == "defrag"


def test_dcgm_watch_names_cacert_on_a_certificate_failure_and_gets_past_tls_with_it(tls_engine):
    url, cert = tls_engine
    bad = run_zgtool("dcgm", "watch", "--engine", url, "--once", "--json")
    assert bad.returncode == 3 and "certificate did not verify" in bad.stderr
    ok = run_zgtool("dcgm", "watch", "--engine", url, "--once", "--json", "--cacert", cert)
    assert "certificate" not in ok.stderr  # past TLS: what follows is about the metrics themselves


def test_cacert_and_insecure_exclude_each_other(tmp_path: Path):
    cert = tmp_path / "c.pem"
    cert.write_text("x")
    proc = run_zgtool("client", "ask", "https://127.0.0.1:9", "hi", "--cacert", cert, "--insecure")
    assert proc.returncode == 2 and "exclude each other" in proc.stderr


def test_a_501_is_not_retried_and_an_html_page_is_reduced_to_its_title(scripted: ScriptedServer, tmp_path: Path):
    page = (b"<!DOCTYPE html><html><head><title>501 Not Implemented</title><style>body{}</style></head>"
            b"<body><h1>Not Implemented</h1><p>" + b"padding " * 200 + b"</p></body></html>")
    scripted.script(Step(501, body=page, content_type="text/html"), Step(200))
    out = tmp_path / "ask.json"
    proc = run_zgtool("client", "ask", scripted.url, "hello", "-o", out)
    assert proc.returncode == 4, proc.stderr
    assert "501: 501 Not Implemented (an HTML page)" in proc.stderr and "padding" not in proc.stderr
    assert json.loads(out.read_text())["data"]["num_attempts"] == 1

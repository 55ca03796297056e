"""Probes against the real local paths (zgtool.gateway.supervisor.LocalStack): the engine direct,
nginx (streaming and buffered), pygw, and nginx -> pygw; and probe tls on `zgtool serve --tls`."""

from __future__ import annotations

import os
import ssl
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from probe_servers import free_port

from zgtool.probes.headers import probe_headers
from zgtool.probes.stream import probe_stream
from zgtool.probes.tls import probe_tls
from zgtool.targets import resolve

# dummy:tiny, not null: its tokens take real compute, so a stream lasts long enough (~0.2 s on
# CPU) for buffering to be told apart from streaming; null answers in a few ms.
MODEL = "dummy:tiny"
MAX_TOKENS = 64


@pytest.fixture(scope="module")
def stack() -> Iterator[dict[str, str]]:
    from zgtool.gateway.supervisor import LocalStack, StackConfig

    with LocalStack(StackConfig(model=MODEL, paths=("nginx", "nginx-buffered", "pygw", "stack"))) as st:
        yield dict(st.urls)


def detected(url: str) -> tuple[set[str], set[str], int]:
    a = probe_headers(resolve(url)).analysis
    return {d.id for d in a.origin}, {d.id for d in a.intermediaries if d.confidence >= 0.5}, a.hop_estimate


@pytest.mark.slow
def test_direct_engine_is_zgtool_engine_with_no_intermediary(stack: dict[str, str]) -> None:
    r = probe_headers(resolve(stack["direct"]))
    assert [d.id for d in r.analysis.origin] == ["zgtool-engine"]
    assert r.analysis.origin[0].evidence[0].what.startswith("server: zgtool-engine/")
    assert r.analysis.intermediaries == [] and r.analysis.hop_estimate == 0


@pytest.mark.slow
@pytest.mark.parametrize(("path", "expected", "hops"), [
    ("nginx", {"nginx"}, 1), ("nginx-buffered", {"nginx"}, 1), ("pygw", {"zgtool-pygw"}, 1),
    ("stack", {"nginx", "zgtool-pygw"}, 2),
])
def test_gateway_paths_are_detected_with_their_hop_count(stack: dict[str, str], path: str, expected: set[str],
                                                         hops: int) -> None:
    origin, inter, hop_estimate = detected(stack[path])
    assert inter == expected and hop_estimate == hops
    assert origin == {"zgtool-engine"}  # the engine stays visible behind every path


@pytest.mark.slow
@pytest.mark.parametrize(("path", "verdict"), [("direct", "streaming"), ("nginx", "streaming"),
                                               ("nginx-buffered", "buffering")])
def test_stream_probe_flags_only_the_buffered_nginx(stack: dict[str, str], path: str, verdict: str) -> None:
    # On a loaded 2-core box the engine's own event loop can be starved for a whole (~0.2 s) answer
    # and write it at once, which is indistinguishable on the wire from a held buffer; so the
    # verdict is the majority of three probes, each with the engine's emission times.
    runs = [probe_stream(resolve(stack[path]), max_tokens=MAX_TOKENS) for _ in range(3)]
    assert all(r.emission is not None for r in runs)  # the engine's timing event gives the emission span
    verdicts = [r.buffering.verdict for r in runs]
    assert verdicts.count(verdict) >= 2, [r.buffering.reason for r in runs]


@pytest.fixture(scope="module")
def tls_engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    port, tls_dir = free_port(), tmp_path_factory.mktemp("engine-tls")
    log = open(tls_dir / "engine.log", "wb")  # noqa: SIM115 - closed below
    proc = subprocess.Popen([sys.executable, "-m", "zgtool", "serve", "--model", "null", "--host", "127.0.0.1",
                             "--port", str(port), "--tls", "self-signed", "--tls-dir", str(tls_dir)],
                            stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    url = f"https://127.0.0.1:{port}"
    try:
        _wait_healthy(url, proc, tls_dir / "engine.log")
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


def _wait_healthy(url: str, proc: subprocess.Popen[bytes], log: Path) -> None:
    ctx = ssl._create_unverified_context()
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"zgtool serve --tls exited: {log.read_text()[-2000:]}")
        try:
            with urllib.request.urlopen(url + "/health", context=ctx, timeout=1) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.2)
    raise RuntimeError(f"zgtool serve --tls not healthy after 120 s: {log.read_text()[-2000:]}")


@pytest.mark.slow
def test_tls_probe_on_the_engine_reports_its_self_signed_names_and_alpn(tls_engine: str) -> None:
    r = probe_tls(resolve(tls_engine))
    c = r.certificate
    assert c is not None and c.self_signed
    assert c.subject_cn == "zgtool-engine localhost"
    assert c.sans_dns == ["localhost"] and set(c.sans_ip) == {"127.0.0.1", "::1"}
    # the engine terminates TLS itself and speaks only HTTP/1.1: never h2
    assert r.alpn in (None, "http/1.1")
    assert r.version in ("TLSv1.3", "TLSv1.2") and r.ja4s is not None and r.handshake_ms > 0
    h = probe_headers(resolve(tls_engine), insecure=True)
    assert [d.id for d in h.analysis.origin] == ["zgtool-engine"] and h.analysis.intermediaries == []

"""Fixtures: real local servers for the probes, started once per module and always stopped."""

from __future__ import annotations

import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

# the helper module sits next to this file; pytest's importlib mode does not put it on sys.path
sys.path.insert(0, str(Path(__file__).parent))
from probe_servers import (  # noqa: E402
    FakeOrigin,
    Nginx,
    NotHTTPServer,
    OriginConfig,
    ThreadedUvicorn,
    TLSServer,
)


@pytest.fixture(scope="module")
def origin() -> Iterator[ThreadedUvicorn]:
    with ThreadedUvicorn(FakeOrigin(OriginConfig())) as srv:
        yield srv


@pytest.fixture(scope="module")
def origin_without_times() -> Iterator[ThreadedUvicorn]:
    with ThreadedUvicorn(FakeOrigin(OriginConfig(emit_times=False))) as srv:
        yield srv


@pytest.fixture(scope="module")
def nginx(origin: ThreadedUvicorn, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Nginx]:
    if not (shutil.which("nginx") or Path("/usr/sbin/nginx").exists()):
        pytest.skip("nginx is not installed (apt-get install -y nginx)")
    with Nginx(origin.port, tmp_path_factory.mktemp("nginx")) as ng:
        yield ng


@pytest.fixture(scope="module")
def nginx_without_times(origin_without_times: ThreadedUvicorn,
                        tmp_path_factory: pytest.TempPathFactory) -> Iterator[Nginx]:
    if not (shutil.which("nginx") or Path("/usr/sbin/nginx").exists()):
        pytest.skip("nginx is not installed (apt-get install -y nginx)")
    with Nginx(origin_without_times.port, tmp_path_factory.mktemp("nginx2")) as ng:
        yield ng


@pytest.fixture(scope="module")
def tls_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TLSServer]:
    with TLSServer(tmp_path_factory.mktemp("tls")) as srv:
        yield srv


@pytest.fixture(scope="module")
def tls_server_h2(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TLSServer]:
    with TLSServer(tmp_path_factory.mktemp("tls2"), cn="edge.test", sans=("edge.test",), alpn=("h2", "http/1.1")) as srv:
        yield srv


@pytest.fixture(scope="module")
def not_http() -> Iterator[NotHTTPServer]:
    with NotHTTPServer() as srv:
        yield srv

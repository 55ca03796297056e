"""probe tls against real local TLS servers (self-signed certificates made in the fixture)."""

from __future__ import annotations

import pytest
from probe_servers import ThreadedUvicorn, TLSServer

from zgtool.errors import TargetUnreachable, UsageError
from zgtool.probes.tls import probe_tls
from zgtool.targets import resolve


def test_tls_probe_reports_certificate_names_alpn_and_a_ja4s(tls_server: TLSServer) -> None:
    r = probe_tls(resolve(tls_server.url))
    c = r.certificate
    assert c is not None
    assert c.subject_cn == "probe.test"
    assert c.sans_dns == ["probe.test", "localhost"] and c.sans_ip == ["127.0.0.1"]
    assert c.self_signed and c.issuer == c.subject and 29 < c.days_left <= 30
    assert r.alpn == "http/1.1" and r.alpn_offered == ["h2", "http/1.1"]
    assert r.version == "TLSv1.3" and r.server_hello is not None and r.server_hello.version == "TLSv1.3"
    assert r.ja4s is not None and r.ja4s.startswith("t13") and r.ja4s == r.server_hello.ja4s
    assert r.handshake_ms > 0 and r.chain_length == 1
    assert r.verified is False and r.verify_error  # self-signed: a default client would refuse it
    assert any("self-signed" in n for n in r.notes) and any("only HTTP/1.1" in n for n in r.notes)


def test_an_h2_answer_is_noted_as_a_terminator_that_is_not_uvicorn(tls_server_h2: TLSServer) -> None:
    r = probe_tls(resolve(tls_server_h2.url))
    assert r.alpn == "h2" and r.certificate.subject_cn == "edge.test"
    assert any("something else" in n or "proxy, load balancer or CDN" in n for n in r.notes)


def test_a_plain_http_target_is_a_usage_error(origin: ThreadedUvicorn) -> None:
    with pytest.raises(UsageError, match="plain http"):
        probe_tls(resolve(origin.url))


def test_a_port_that_does_not_speak_tls_is_unreachable(origin: ThreadedUvicorn) -> None:
    with pytest.raises(TargetUnreachable, match="TLS handshake"):
        probe_tls(resolve(f"https://127.0.0.1:{origin.port}"), timeout_s=3)

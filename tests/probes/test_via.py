"""Via (RFC 9110 §7.6.3) parsing over real-world values."""

from __future__ import annotations

import pytest

from zgtool.probes.via import ViaHop, parse_via

CASES = [
    ("1.1 varnish", [ViaHop("HTTP/1.1", "varnish", None)]),
    ("1.1 varnish, 1.1 varnish", [ViaHop("HTTP/1.1", "varnish", None)] * 2),  # Fastly shield + edge
    ("1.1 5f2c1d0e6a7b.cloudfront.net (CloudFront)",
     [ViaHop("HTTP/1.1", "5f2c1d0e6a7b.cloudfront.net", "CloudFront")]),
    ("1.1 google", [ViaHop("HTTP/1.1", "google", None)]),
    ("1.0 fred, 1.1 p.example.net", [ViaHop("HTTP/1.0", "fred", None), ViaHop("HTTP/1.1", "p.example.net", None)]),
    ("HTTP/2 edge.example:443 (Apache/2.4, mod_proxy)",
     [ViaHop("HTTP/2", "edge.example:443", "Apache/2.4, mod_proxy")]),
    ("kong/2.8.1", [ViaHop("", "kong/2.8.1", None)]),  # older Kong: not RFC-shaped
    ("1.1 kong/3.4.2", [ViaHop("HTTP/1.1", "kong/3.4.2", None)]),
    ("1.1 Caddy", [ViaHop("HTTP/1.1", "Caddy", None)]),
    ("1.1 pygw", [ViaHop("HTTP/1.1", "pygw", None)]),
    ("", []),
    ("  ,  1.1 a ,", [ViaHop("HTTP/1.1", "a", None)]),
]


@pytest.mark.parametrize(("value", "hops"), CASES)
def test_via_values_parse_into_hops_in_order(value: str, hops: list[ViaHop]) -> None:
    assert parse_via(value) == hops


def test_several_via_headers_concatenate_first_hop_first() -> None:
    hops = parse_via(["1.1 varnish", "1.1 google"])
    assert [h.received_by for h in hops] == ["varnish", "google"]

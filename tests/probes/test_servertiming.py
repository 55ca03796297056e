"""Server-Timing parsing per the W3C processing rules, over real-world values."""

from __future__ import annotations

import pytest

from zgtool.probes.servertiming import Metric, parse_server_timing

CASES = [
    # the spec's example
    ('miss, db;dur=53, app;dur=47.2, cache;desc="Cache Read";dur=23.2',
     [Metric("miss", None, None), Metric("db", 53.0, None), Metric("app", 47.2, None),
      Metric("cache", 23.2, "Cache Read")]),
    # zgtool engine + pygw parts
    ("queue;dur=0.012, prefill;dur=1.5, decode;dur=20.25, total;dur=22.0, gw_auth;dur=0.05",
     [Metric("queue", 0.012, None), Metric("prefill", 1.5, None), Metric("decode", 20.25, None),
      Metric("total", 22.0, None), Metric("gw_auth", 0.05, None)]),
    # Cloudflare
    ("cfL4;desc=\"?proto=TCP&rtt=1234&min_rtt=900\", cfEdge;dur=12,cfOrigin;dur=80",
     [Metric("cfL4", None, "?proto=TCP&rtt=1234&min_rtt=900"), Metric("cfEdge", 12.0, None),
      Metric("cfOrigin", 80.0, None)]),
    # only the first occurrence of a parameter counts; unknown parameters are ignored
    ("a;dur=1;dur=2;foo=bar", [Metric("a", 1.0, None)]),
    # a dur that does not parse becomes 0
    ("a;dur=abc", [Metric("a", 0.0, None)]),
    # quoted strings may hold commas and escapes; whitespace around ; and = is allowed
    ('edge ; desc = "a, \\"b\\"" ; dur = 5', [Metric("edge", 5.0, 'a, "b"')]),
    # junk is skipped, the rest still parses
    ("@@@, ok;dur=3", [Metric("ok", 3.0, None)]),
    ("", []),
]


@pytest.mark.parametrize(("value", "metrics"), CASES)
def test_server_timing_values_parse_per_w3c_rules(value: str, metrics: list[Metric]) -> None:
    assert parse_server_timing(value) == metrics


def test_several_headers_and_repeated_names_are_all_kept() -> None:
    got = parse_server_timing(["db;dur=1", "db;dur=2, edge;dur=3"])
    assert [(m.name, m.dur_ms) for m in got] == [("db", 1.0), ("db", 2.0), ("edge", 3.0)]

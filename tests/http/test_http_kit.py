"""zgtool.http, the protocol kit both the engine server and pygw use."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from zgtool.http import finish
from zgtool.http.errors import ApiError, ConfigError, error_body, error_payload, parse_error_body
from zgtool.http.keys import api_key, load_keys, parse_keys
from zgtool.http.sse import SSEParser, comment, data, event, timing_comment
from zgtool.http.toml import load_toml, parse_toml

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.mark.parametrize(("status", "etype", "otype", "code"), [
    (400, "invalid_request_error", "invalid_request_error", None),
    (401, "authentication_error", "authentication_error", "invalid_api_key"),
    (403, "permission_error", "permission_error", "permission_denied"),
    (404, "not_found_error", "invalid_request_error", "not_found"),
    (413, "request_too_large", "invalid_request_error", "request_too_large"),
    (429, "rate_limit_error", "rate_limit_error", "rate_limit_exceeded"),
    (500, "api_error", "server_error", "internal_error"),
    (529, "overloaded_error", "server_error", "overloaded"),
])
def test_openai_errors_use_openai_types_and_codes(status: int, etype: str, otype: str, code: str | None) -> None:
    err = ApiError(status, etype, "msg")
    o = error_payload(err, "openai", "req_1")["error"]
    assert (o["type"], o["code"], o["message"], o["param"]) == (otype, code, "msg", None)
    a = json.loads(error_body(err, "anthropic", "req_1"))
    assert a == {"type": "error", "error": {"type": etype, "message": "msg"}, "request_id": "req_1"}


def test_an_explicit_code_and_param_win() -> None:
    err = ApiError(400, None, "seed: too big", code="unsupported_parameter", param="seed")
    assert err.error_type == "invalid_request_error"
    o = error_payload(err, "openai", "")["error"]
    assert (o["code"], o["param"]) == ("unsupported_parameter", "seed")


def test_upstream_error_bodies_of_either_shape_parse_back() -> None:
    a = parse_error_body(b'{"type":"error","error":{"type":"overloaded_error","message":"busy"}}', 529)
    assert (a.status, a.error_type, a.message) == (529, "overloaded_error", "busy")
    o = parse_error_body(b'{"error":{"type":"server_error","message":"x","code":null}}', 503)
    assert o.error_type == "overloaded_error"
    t = parse_error_body(b"<html>bad gateway</html>", 502)
    assert t.error_type == "api_error" and "bad gateway" in t.message


def test_sse_parser_handles_splits_crlf_and_comments() -> None:
    raw = event("a", {"x": 1}) + timing_comment({"total_ms": 2.5}) + data({"y": 2}) + b"data: [DONE]\n\n"
    raw = raw.replace(b"\n", b"\r\n")
    for step in (1, 3, len(raw)):
        p = SSEParser()
        evs = [e for i in range(0, len(raw), step) for e in p.feed(raw[i:i + step])]
        assert [(e.event, e.data) for e in evs] == [("a", '{"x":1}'), ("", ""), ("message", '{"y":2}'),
                                                    ("message", "[DONE]")]
        assert evs[1].timing == {"total_ms": 2.5} and evs[0].json() == {"x": 1}
    assert comment("a\nb") == b": a\n: b\n\n"


def test_api_key_from_x_api_key_or_bearer() -> None:
    assert api_key({b"x-api-key": b"k1"}) == b"k1"
    assert api_key([(b"authorization", b"Bearer  k2 ")]) == b"k2"
    assert api_key({b"authorization": b"Basic abc"}) is None and api_key({}) is None


def test_both_keys_file_formats_load() -> None:
    eng = load_keys(EXAMPLES / "keys.toml")
    assert {k.name for k in eng.keys} == {"alice", "bench"} and eng.tiers["free"].max_concurrent == 2
    assert eng.match(b"sk-zg-free-change-me")[0].name == "alice"          # type: ignore[union-attr]
    assert eng.match(b"sk-zg-admin-change-me") == (None, True)
    legacy = load_keys(EXAMPLES / "pygw-keys.toml")
    team = legacy.match(b"sk-gw-team-a")[0]
    assert team is not None and legacy.tiers[team.tier].requests_per_min == 120
    assert legacy.tiers[team.tier].burst == 10 and legacy.upstream_key_env == "ZG_UPSTREAM_API_KEY"
    assert parse_keys({"keys": [{"key": "k"}], "metrics": {"require_key": True}}, "x").metrics_require_key


def test_toml_errors_are_the_kits_one_line_config_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        load_toml(tmp_path / "nope.toml", "keys file")
    with pytest.raises(ValueError, match="p.toml: invalid TOML"):
        parse_toml("a = = 1", "p.toml", ValueError)


def test_finish_reasons_in_each_api() -> None:
    assert finish.anthropic_stop_reason("stop", "\n\n") == "stop_sequence"
    assert finish.anthropic_stop_reason("length") == "max_tokens"
    assert finish.openai_finish_reason("length") == "length" and finish.openai_finish_reason(None) is None
    assert finish.openai_from_anthropic("max_tokens") == "length"


def test_a_timing_comment_has_json_dumps_bytes_for_every_timing_a_stream_carries() -> None:
    """timing_comment writes with orjson: for what a timing event holds (ms rounded to 3 places,
    ints, None, ASCII ids, lists of them) the bytes are json.dumps' compact ones, and a non-ASCII
    string is escaped as json.dumps escapes it."""
    import json
    import random

    from zgtool.http.sse import timing_comment

    rng = random.Random(34)
    for _ in range(2000):
        ms = lambda: round(rng.uniform(0, 10 ** rng.randint(0, 9)), 3)  # noqa: E731
        ev = {"queue_ms": ms(), "prefill_ms": ms(), "decode_ms": 0.0, "total_ms": ms(),
              "ttft_ms": rng.choice([None, ms()]), "token_times_ms": [ms() for _ in range(rng.randint(0, 40))],
              "request_id": f"inference-{rng.getrandbits(40):x}", "n": rng.randint(0, 10**6)}
        want = b": zgtool-timing " + json.dumps(ev, separators=(",", ":")).encode() + b"\n\n"
        assert timing_comment(ev) == want
    odd = {"request_id": "inférence-\u2028", "x": 1.5}
    assert timing_comment(odd) == b": zgtool-timing " + json.dumps(odd, separators=(",", ":")).encode() + b"\n\n"

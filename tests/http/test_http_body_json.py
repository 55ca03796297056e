"""zgtool.http.body's JSON: the orjson fast path accepts and rejects exactly what json does."""

from __future__ import annotations

import json

import pytest

from zgtool.http.body import dumps, load_json
from zgtool.http.errors import ApiError


@pytest.mark.parametrize("raw", [
    b'{"model": "m", "max_tokens": 16, "messages": [{"role": "user", "content": "h\\u00e9llo \\ud83d\\ude00"}]}',
    b'{"a": 123456789012345678901234567890}',     # past 64 bits: json keeps an exact int
    b'{"a": -9223372036854775809, "b": 18446744073709551616}',
    b'{"a": NaN, "b": Infinity, "c": 1e400}',     # json extensions orjson refuses
    b'{"a": 1, "a": 2}',
    "{\"t\": \"caf\u00e9 \u4e2d\"}".encode(),
])
def test_accepted_bodies_decode_exactly_as_json_decodes_them(raw: bytes) -> None:
    got = load_json(raw)
    want = json.loads(raw)
    assert repr(got) == repr(want)        # repr: NaN != NaN, and int vs float must match
    assert type(got["a"] if "a" in got else got) is type(want["a"] if "a" in want else want)


@pytest.mark.parametrize(("raw", "message"), [
    (b'{"a": "\\ud800"}', "lone UTF-16 surrogate"),
    (b"\xff{}", "not valid UTF-8"),
    (b'{"a": }', "not valid JSON"),
    (b"[" * 3000 + b"]" * 3000, "too deeply"),
    (b'{"a": ' + b"9" * 4400 + b"}", "4300 digits"),
    (b"", "empty"),
])
def test_rejected_bodies_keep_jsons_messages(raw: bytes, message: str) -> None:
    with pytest.raises(ApiError) as exc:
        load_json(raw)
    assert exc.value.status == 400
    assert message in str(exc.value)


def test_answers_encode_compact_utf8_and_fall_back_for_lone_surrogates() -> None:
    obj = {"text": "caf\u00e9", "n": 1, "x": None, "ok": True, "f": 0.5}
    assert dumps(obj) == '{"text":"caf\u00e9","n":1,"x":null,"ok":true,"f":0.5}'.encode()
    assert json.loads(dumps({"text": "a\ud800b"})) == {"text": "a\ud800b"}

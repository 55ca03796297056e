"""Request parsing for both wire formats: every mistake names its field."""

from __future__ import annotations

import pytest

from zgtool.engine.api import anthropic as anth
from zgtool.engine.api import openai as oai
from zgtool.engine.errors import InvalidRequest
from zgtool.http.body import load_json_object
from zgtool.http.errors import ApiError

OK = {"model": "null", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}


def test_anthropic_accepts_system_blocks_and_text_blocks() -> None:
    req = anth.parse_messages({**OK, "system": [{"type": "text", "text": "be brief"}],
                               "messages": [{"role": "user", "content": [{"type": "text", "text": "a"},
                                                                         {"type": "text", "text": "b"}]}],
                               "stop_sequences": ["\n\n"], "top_k": 5, "temperature": 0.5,
                               "metadata": {"user_id": "u1"}, "stream": True}, 4096)
    assert req.system == "be brief"
    assert req.messages == [{"role": "user", "content": "ab"}]
    assert (req.stop, req.top_k, req.temperature, req.stream) == (("\n\n",), 5, 0.5, True)


@pytest.mark.parametrize(("body", "field"), [
    ({k: v for k, v in OK.items() if k != "max_tokens"}, "max_tokens: field required"),
    ({k: v for k, v in OK.items() if k != "model"}, "model: field required"),
    ({**OK, "max_tokens": 0}, "max_tokens: must be at least 1"),
    ({**OK, "max_tokens": "8"}, "max_tokens: must be an integer"),
    ({**OK, "max_tokens": 100000}, "max_tokens: 100000 > 4096"),
    ({**OK, "messages": []}, "messages: at least one message"),
    ({**OK, "messages": "hi"}, "messages: must be an array"),
    ({**OK, "messages": [{"role": "robot", "content": "x"}]}, "messages.0.role"),
    ({**OK, "messages": [{"role": "user"}]}, "messages.0.content: field required"),
    ({**OK, "temperature": 1.5}, "temperature: must be between 0 and 1"),
    ({**OK, "stop_sequences": "x"}, "stop_sequences: must be an array of strings"),
])
def test_anthropic_rejects_bad_fields_naming_them(body: dict, field: str) -> None:
    with pytest.raises(InvalidRequest, match=field.replace("(", r"\(")):
        anth.parse_messages(body, 4096)


def test_non_text_content_blocks_are_not_supported_with_a_clear_message() -> None:
    body = {**OK, "messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]}
    with pytest.raises(InvalidRequest, match="'image' content blocks are not supported"):
        anth.parse_messages(body, 4096)
    body = {"model": "m", "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]}
    with pytest.raises(InvalidRequest, match="'image_url' content blocks are not supported"):
        oai.parse_chat(body, 4096)


def test_openai_folds_system_messages_and_reads_stream_options() -> None:
    req = oai.parse_chat({"model": "m", "stream": True, "stream_options": {"include_usage": True},
                          "messages": [{"role": "system", "content": "sys"},
                                       {"role": "user", "content": "hi"}], "stop": "END",
                          "max_completion_tokens": 7}, 4096)
    assert req.system == "sys" and req.messages == [{"role": "user", "content": "hi"}]
    assert (req.include_usage, req.stop, req.max_tokens) == (True, ("END",), 7)


@pytest.mark.parametrize(("body", "field"), [
    ({"messages": [{"role": "user", "content": "x"}]}, "model: field required"),
    ({"model": "m", "messages": [{"role": "user", "content": "x"}], "n": 2}, "n: only n=1"),
    ({"model": "m", "messages": [{"role": "user", "content": "x"}], "max_tokens": 0}, "max_tokens: must be at least 1"),
    ({"model": "m", "messages": [{"role": "user", "content": "x"}], "temperature": 3}, "temperature"),
    ({"model": "m", "messages": [{"role": "tool", "content": "x"}]}, "messages.0.role"),
])
def test_openai_rejects_bad_fields_naming_them(body: dict, field: str) -> None:
    with pytest.raises(InvalidRequest, match=field):
        oai.parse_chat(body, 4096)


@pytest.mark.parametrize(("raw", "msg"), [
    (b"", "empty"), (b"{not json", "not valid JSON"), (b"\xff\xfe{}", "not valid UTF-8"),
    (b"[1, 2]", "must be a JSON object"), (b'{"a": "\\ud800"}', "lone UTF-16 surrogate"),
    (b"[" * 3000 + b"]" * 3000, "too deeply"), (b'{"a": ' + b"9" * 4400 + b"}", "4300 digits"),
])
def test_body_decoding_errors_are_400s(raw: bytes, msg: str) -> None:
    with pytest.raises(ApiError, match=msg) as err:
        load_json_object(raw)
    assert err.value.status == 400 and err.value.error_type == "invalid_request_error"


def test_openai_stream_tail_puts_timing_in_a_comment_before_done() -> None:
    w = oai.ChunkWriter("chatcmpl-1", "m")
    tail = w.tail("length", None, {"total_ms": 1.0}).decode()
    chunks = [c for c in tail.split("\n\n") if c]
    assert chunks[-1] == "data: [DONE]"
    assert chunks[-2].startswith(": zgtool-timing {") and '"finish_reason":"length"' in chunks[-3]
    assert "zgtool_timing" not in tail

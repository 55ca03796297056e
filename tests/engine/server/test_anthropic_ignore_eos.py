"""The Anthropic API takes zgtool's ignore_eos extension (as OpenAI's does; pygw forwards it)."""

from __future__ import annotations

import pytest

from zgtool.engine.api.anthropic import parse_messages
from zgtool.engine.errors import InvalidRequest

BODY = {"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]}


def test_ignore_eos_is_read_from_an_anthropic_request():
    assert parse_messages({**BODY, "ignore_eos": True}, 100).ignore_eos is True
    assert parse_messages(BODY, 100).ignore_eos is False


def test_a_malformed_ignore_eos_is_an_invalid_request():
    with pytest.raises(InvalidRequest):
        parse_messages({**BODY, "ignore_eos": "yes"}, 100)

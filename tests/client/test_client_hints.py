"""Load-hint and rate-limit header parsing: typed when well formed, ignored (never raised) when not."""

from __future__ import annotations

import json
import logging

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scripted_llm_server import ScriptedServer, Step

from zgtool.client import Client, LoadHint, RetryConfig, parse_load_hint, parse_rate_limits
from zgtool.targets import Target


def test_engine_hint_is_parsed_into_a_typed_object() -> None:
    hint = parse_load_hint({"X-GPU-Load-Hint": '{"kv_util": 0.42, "running": 3, "waiting": 0}'})
    assert hint == LoadHint(kv_util=0.42, running=3, waiting=0)
    assert hint.util_pct == pytest.approx(42.0)


def test_gpu_fields_are_parsed_and_sm_util_drives_util_pct() -> None:
    hint = parse_load_hint({"x-gpu-load-hint": json.dumps(
        {"sm_util": 97, "vram_free_gb": 12.5, "kv_util": 0.1, "running": 1, "waiting": 2, "pool": "a"})})
    assert hint is not None and hint.sm_util == 97.0 and hint.vram_free_gb == 12.5
    assert hint.util_pct == 97.0 and hint.extra == {"pool": "a"}


@pytest.mark.parametrize("raw", [
    "", "not json", "{", "[1, 2]", "42", "null", '"text"', "{}", '{"kv_util": "high"}',
    '{"kv_util": NaN}', '{"kv_util": -1}', '{"kv_util": 7}', '{"sm_util": 250}', '{"running": true}',
    '{"running": 1.5}', '{"waiting": -3}', '{"kv_util": {"a": 1}}', "[" * 5000,
])
def test_malformed_hints_are_ignored_with_a_debug_log(raw: str, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="zgtool.client.hints")
    assert parse_load_hint({"x-gpu-load-hint": raw}) is None
    assert caplog.records, "an ignored header should leave a debug trace"


def test_a_partly_wrong_hint_keeps_its_good_fields() -> None:
    hint = parse_load_hint({"x-gpu-load-hint": '{"kv_util": "x", "running": 4, "waiting": 1}'})
    assert hint == LoadHint(kv_util=None, running=4, waiting=1) and hint.util_pct is None


def test_missing_header_means_no_hint() -> None:
    assert parse_load_hint({}) is None and parse_load_hint(None) is None


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.text(max_size=200), st.recursive(
    st.none() | st.booleans() | st.floats() | st.integers() | st.text(max_size=10),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(
        st.sampled_from(["kv_util", "running", "waiting", "sm_util", "vram_free_gb", "x"]), inner, max_size=6),
    max_leaves=12).map(lambda v: json.dumps(v, allow_nan=True))))
def test_no_header_value_makes_the_parser_raise(raw: str) -> None:
    hint = parse_load_hint({"x-gpu-load-hint": raw})
    assert hint is None or isinstance(hint, LoadHint)
    parse_rate_limits({"anthropic-ratelimit-tokens-remaining": raw, "retry-after": raw, "retry-after-ms": raw})


def test_openai_style_rate_limit_headers_are_read() -> None:
    rl = parse_rate_limits({"x-ratelimit-limit-requests": "60", "x-ratelimit-remaining-requests": "59",
                            "x-ratelimit-reset-requests": "1s", "retry-after": "2"})
    assert rl.buckets["requests"].remaining == 59 and rl.buckets["requests"].reset == "1s"
    assert rl.retry_after_s == 2.0


def test_a_malformed_hint_from_a_server_does_not_break_the_request(scripted: ScriptedServer) -> None:
    scripted.script(Step(200, {"x-gpu-load-hint": "{kv_util: oops"}),
                    Step(529, {"x-gpu-load-hint": "[]", "retry-after-ms": "garbage", "retry-after": "0"}),
                    Step(200, {"x-gpu-load-hint": '{"kv_util": 0.5, "running": 2, "waiting": 0}'}))
    with Client(Target("s", scripted.url), retry=RetryConfig(base_delay_s=0.01)) as c:
        first = c.ask("hi")
        second = c.ask("hi", stream=True)
    assert first.ok and first.load_hint is None
    assert second.ok and second.load_hint == LoadHint(kv_util=0.5, running=2, waiting=0)
    assert second.attempts[0].load_hint is None and second.attempts[0].wait_s == 0.0

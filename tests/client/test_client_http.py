"""Retries against a real scripted HTTP server, through the official SDKs."""

from __future__ import annotations

import json

import pytest
from scripted_llm_server import ScriptedServer, Step, anthropic_events, free_port

from zgtool.client import Client, RequestFailed, RetryConfig
from zgtool.targets import Target

FAST = RetryConfig(max_attempts=4, base_delay_s=0.01, max_delay_s=0.05)


def client_for(url: str, api: str = "anthropic", retry: RetryConfig = FAST, timeout_s: float = 5.0,
               model: str = "big") -> Client:
    return Client(Target("scripted", url, api, model), retry=retry, timeout_s=timeout_s)


def test_429_with_retry_after_is_waited_out_then_succeeds(scripted: ScriptedServer) -> None:
    scripted.script(Step(429, {"retry-after": "1"}), Step(200))
    with client_for(scripted.url) as c:
        res = c.ask("hi", max_tokens=8)
    assert res.ok and res.text == "hello there"
    assert [a.status for a in res.attempts] == [429, 200]
    first = res.attempts[0]
    assert first.retried and first.wait_s == 1.0 and "retry-after" in first.reason
    assert len(scripted.seen) == 2
    assert scripted.seen[1].at_s - scripted.seen[0].at_s >= 0.95  # the wait happened, not just recorded


def test_retry_after_ms_takes_precedence_over_retry_after(scripted: ScriptedServer) -> None:
    scripted.script(Step(529, {"retry-after-ms": "50", "retry-after": "30"}), Step(200))
    with client_for(scripted.url) as c:
        res = c.ask("hi")
    assert res.ok
    assert res.attempts[0].wait_s == pytest.approx(0.05)
    assert res.attempts[0].error_type == "overloaded_error"


def test_400_is_not_retried(scripted: ScriptedServer) -> None:
    scripted.script(Step(400), Step(200))
    with client_for(scripted.url) as c, pytest.raises(RequestFailed) as info:
        c.ask("hi")
    assert len(scripted.seen) == 1
    (attempt,) = info.value.result.attempts
    assert attempt.status == 400 and not attempt.retried and "not retryable" in attempt.reason
    assert info.value.failure.error_type == "invalid_request_error"


def test_x_should_retry_false_stops_retries_on_a_5xx(scripted: ScriptedServer) -> None:
    scripted.script(Step(500, {"x-should-retry": "false"}), Step(200))
    with client_for(scripted.url) as c, pytest.raises(RequestFailed) as info:
        c.ask("hi")
    assert len(scripted.seen) == 1
    assert "x-should-retry: false" in info.value.result.attempts[0].reason


def test_x_should_retry_true_retries_even_a_400(scripted: ScriptedServer) -> None:
    scripted.script(Step(400, {"x-should-retry": "true"}), Step(200))
    with client_for(scripted.url) as c:
        res = c.ask("hi")
    assert res.ok and len(scripted.seen) == 2


def test_5xx_backoff_gives_up_after_max_attempts_with_every_attempt_recorded(scripted: ScriptedServer) -> None:
    scripted.script(*[Step(503)] * 5)
    with client_for(scripted.url, retry=RetryConfig(max_attempts=3, base_delay_s=0.01)) as c:
        with pytest.raises(RequestFailed) as info:
            c.ask("hi")
    attempts = info.value.result.attempts
    assert [a.status for a in attempts] == [503, 503, 503]
    assert [a.retried for a in attempts] == [True, True, False]
    assert all(0 <= a.wait_s <= 0.04 for a in attempts[:2])  # full jitter within the backoff ceiling
    assert "gave up after 3" in attempts[-1].reason and len(scripted.seen) == 3


def test_every_attempt_carries_the_same_idempotency_key(scripted: ScriptedServer) -> None:
    scripted.script(Step(529), Step(502), Step(200))
    with client_for(scripted.url) as c:
        res = c.ask("hi")
    keys = {s.headers.get("idempotency-key") for s in scripted.seen}
    assert keys == {res.idempotency_key} and len(scripted.seen) == 3
    # The SDK's own retries are off: every request the server saw is one of our recorded attempts.
    assert {s.headers.get("x-stainless-retry-count") for s in scripted.seen} <= {"0", None}


def test_stream_cut_after_content_is_not_retried(scripted: ScriptedServer) -> None:
    scripted.script(Step(cut_after=5), Step(200))  # message_start, block_start, ping, "Hel", "lo" then cut
    shown: list[str] = []
    with client_for(scripted.url) as c, pytest.raises(RequestFailed) as info:
        c.ask("hi", stream=True, on_text=shown.append)
    assert len(scripted.seen) == 1
    assert shown == ["Hel", "lo"]
    result = info.value.result
    assert result.content_delivered and result.text == "Hello"
    assert "already delivered content" in result.attempts[0].reason
    assert result.attempts[0].outcome == "connection_lost"


def test_stream_ending_cleanly_without_message_stop_counts_as_cut(scripted: ScriptedServer) -> None:
    scripted.script(Step(close_after=4))
    with client_for(scripted.url) as c, pytest.raises(RequestFailed) as info:
        c.ask("hi", stream=True)
    assert "before message_stop" in info.value.failure.message and len(scripted.seen) == 1


def test_stream_cut_before_content_is_retried(scripted: ScriptedServer) -> None:
    scripted.script(Step(cut_after=2), Step(200))
    with client_for(scripted.url) as c:
        res = c.ask("hi", stream=True)
    assert res.ok and res.text == "Hello!" and len(scripted.seen) == 2
    assert res.attempts[0].outcome == "connection_lost" and res.attempts[0].retried


def test_overloaded_error_event_before_content_is_retried(scripted: ScriptedServer) -> None:
    err = ("error", {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}})
    scripted.script(Step(events=[anthropic_events("big")[0], err]), Step(200))
    with client_for(scripted.url) as c:
        res = c.ask("hi", stream=True)
    assert res.ok and res.attempts[0].error_type == "overloaded_error" and res.attempts[0].retried


def test_refused_connection_is_retried_then_reported_as_connect_failure() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    with client_for(url, retry=RetryConfig(max_attempts=2, base_delay_s=0.01)) as c:
        with pytest.raises(RequestFailed) as info:
            c.ask("hi")
    assert [a.outcome for a in info.value.result.attempts] == ["connect", "connect"]
    assert info.value.result.attempts[0].retried


def test_timeout_is_retried_for_idempotent_requests(scripted: ScriptedServer) -> None:
    scripted.script(Step(delay_s=2.0), Step(200))
    with client_for(scripted.url, timeout_s=0.3) as c:
        res = c.ask("hi")
    assert res.ok and res.attempts[0].outcome == "timeout"


def test_non_idempotent_request_is_not_retried_after_a_timeout_but_is_after_429(
        scripted: ScriptedServer) -> None:
    scripted.script(Step(delay_s=2.0), Step(429, {"retry-after-ms": "10"}), Step(200))
    with client_for(scripted.url, timeout_s=0.3) as c:
        with pytest.raises(RequestFailed) as info:
            c.ask("hi", idempotent=False)
        assert "non-idempotent" in info.value.result.attempts[0].reason
        res = c.ask("hi", idempotent=False)
    assert res.ok and [a.status for a in res.attempts] == [429, 200]


def test_wait_longer_than_max_wait_is_not_attempted(scripted: ScriptedServer) -> None:
    scripted.script(Step(429, {"retry-after": "3600"}))
    with client_for(scripted.url, retry=RetryConfig(max_wait_s=10)) as c, pytest.raises(RequestFailed) as info:
        c.ask("hi")
    assert "3600.0 s > max_wait_s" in info.value.result.attempts[0].reason and len(scripted.seen) == 1


def test_rate_limit_headers_are_reported(scripted: ScriptedServer) -> None:
    scripted.script(Step(200, {"anthropic-ratelimit-requests-limit": "50",
                               "anthropic-ratelimit-requests-remaining": "49",
                               "anthropic-ratelimit-requests-reset": "2025-01-01T00:00:00Z"}))
    with client_for(scripted.url) as c:
        res = c.ask("hi")
    bucket = res.rate_limits.buckets["requests"]
    assert (bucket.limit, bucket.remaining, bucket.reset) == (50, 49, "2025-01-01T00:00:00Z")


def test_openai_api_retries_429_and_streams(scripted: ScriptedServer) -> None:
    scripted.script(Step(429, {"retry-after-ms": "10"}), Step(200))
    with client_for(scripted.url, api="openai") as c:
        res = c.ask("hi", stream=True)
    assert res.ok and res.text == "Hello!" and res.stop_reason == "stop"
    assert [s.path for s in scripted.seen] == ["/v1/chat/completions"] * 2


def test_openai_stream_cut_after_content_is_not_retried(scripted: ScriptedServer) -> None:
    scripted.script(Step(cut_after=2), Step(200))
    with client_for(scripted.url, api="openai") as c, pytest.raises(RequestFailed) as info:
        c.ask("hi", stream=True)
    assert info.value.result.text == "Hel" and len(scripted.seen) == 1


def test_system_prompt_and_model_reach_the_server(scripted: ScriptedServer) -> None:
    with client_for(scripted.url) as c:
        c.ask("hi", system="be brief", model="small")
    body = scripted.seen[0].body
    assert body["system"] == "be brief" and body["model"] == "small"
    assert json.dumps(body["messages"]) == json.dumps([{"role": "user", "content": "hi"}])


def test_openai_error_object_inside_a_stream_before_content_is_retried(scripted: ScriptedServer) -> None:
    scripted.script(Step(events=[("", {"error": {"message": "Overloaded", "type": "overloaded_error"}})]), Step(200))
    with client_for(scripted.url, api="openai") as c:
        res = c.ask("hi", stream=True)
    assert res.ok and res.attempts[0].error_type == "overloaded_error" and res.attempts[0].retried

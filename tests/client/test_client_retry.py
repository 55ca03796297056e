"""Retry decisions: which failures retry, how long to wait, and when to give up."""

from __future__ import annotations

import email.utils
import random
import time

import pytest
from hypothesis import given
from hypothesis import strategies as st

from zgtool.client import Failure, RetryConfig, decide, parse_retry_after_s
from zgtool.client.retry import CONNECT, CONNECTION_LOST, STATUS, TIMEOUT, backoff_s

CFG = RetryConfig(max_attempts=4, base_delay_s=0.5, max_delay_s=8.0)


def status(code: int, **headers: str) -> Failure:
    return Failure(STATUS, f"HTTP {code}", status=code, headers={k.replace("_", "-"): v for k, v in headers.items()})


@pytest.mark.parametrize("code", [408, 409, 429, 500, 502, 503, 504, 529])
def test_retryable_statuses_retry(code: int) -> None:
    assert decide(status(code), 1, CFG).retry


@pytest.mark.parametrize("code", [400, 401, 403, 404, 413, 422])
def test_client_errors_do_not_retry(code: int) -> None:
    d = decide(status(code), 1, CFG)
    assert not d.retry and f"{code} is not retryable" in d.reason


def test_x_should_retry_overrides_the_status_both_ways() -> None:
    assert not decide(status(503, x_should_retry="false"), 1, CFG).retry
    assert decide(status(400, x_should_retry="true"), 1, CFG).retry


def test_content_already_delivered_is_never_retried_even_if_the_server_says_so() -> None:
    f = Failure(CONNECTION_LOST, "cut", content_delivered=True, headers={"x-should-retry": "true"})
    assert not decide(f, 1, CFG).retry


def test_error_event_type_maps_back_to_its_status() -> None:
    f = Failure(STATUS, "overloaded", status=200, error_type="overloaded_error")
    assert f.effective_status == 529 and decide(f, 1, CFG).retry
    assert not decide(Failure(STATUS, "bad", error_type="invalid_request_error"), 1, CFG).retry


def test_non_idempotent_requests_retry_only_when_the_server_surely_did_not_run_them() -> None:
    for f in (Failure(CONNECT, "refused"), status(429), status(529), status(503)):
        assert decide(f, 1, CFG, idempotent=False).retry, f
    for f in (Failure(TIMEOUT, "slow"), Failure(CONNECTION_LOST, "reset"), status(500), status(504)):
        d = decide(f, 1, CFG, idempotent=False)
        assert not d.retry and "non-idempotent" in d.reason, f


def test_retry_after_ms_beats_retry_after_and_both_beat_backoff() -> None:
    assert decide(status(429, retry_after_ms="250", retry_after="9"), 1, CFG).wait_s == 0.25
    assert decide(status(429, retry_after="3"), 1, CFG).wait_s == 3.0


def test_retry_after_as_an_http_date_is_honoured() -> None:
    when = email.utils.formatdate(time.time() + 5, usegmt=True)
    assert 3.0 <= parse_retry_after_s({"retry-after": when}) <= 5.5


@pytest.mark.parametrize("headers", [{"retry-after": "soon"}, {"retry-after-ms": "-5"}, {"retry-after": "inf"}, {}])
def test_unusable_retry_after_falls_back_to_backoff(headers: dict) -> None:
    d = decide(Failure(STATUS, "x", status=503, headers=headers), 1, CFG, rng=random.Random(1))
    assert d.retry and "backoff" in d.reason and 0 <= d.wait_s <= 0.5


def test_attempts_are_capped() -> None:
    d = decide(status(503), 4, CFG)
    assert not d.retry and "gave up after 4 attempt(s)" in d.reason


def test_a_wait_past_the_deadline_gives_up_instead() -> None:
    cfg = RetryConfig(deadline_s=2.0)
    d = decide(status(429, retry_after="5"), 1, cfg, elapsed_s=0.5)
    assert not d.retry and "deadline" in d.reason


@given(st.integers(min_value=0, max_value=200), st.integers(min_value=0, max_value=2**32))
def test_backoff_is_full_jitter_under_an_exponential_ceiling_with_a_cap(n: int, seed: int) -> None:
    wait = backoff_s(n, CFG, random.Random(seed))
    assert 0.0 <= wait <= min(CFG.max_delay_s, CFG.base_delay_s * 2 ** min(n, 60))


def test_invalid_retry_config_is_rejected() -> None:
    with pytest.raises(ValueError):
        RetryConfig(max_attempts=0)
    with pytest.raises(ValueError):
        RetryConfig(deadline_s=0)

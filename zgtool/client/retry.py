"""Retry rules: which failed attempt is retried, and how long to wait first.

Follows the official SDKs' rules (x-should-retry overrides; 408/409/429/5xx/529 and
connection errors retry; retry-after-ms, then retry-after) with two additions the
SDKs leave implicit: a stream that already delivered content is never retried
(a retry would duplicate text the caller has already shown), and idempotency is an
explicit flag — a request marked non-idempotent is only retried when the server
certainly did not run it (never connected, or rejected at admission).
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import dataclass, field

from zgtool.client.hints import LoadHint, header_value, parse_retry_after_s

RETRYABLE_STATUSES = frozenset({408, 409, 429})  # plus every status >= 500 (529 included)
# Statuses that mean "rejected before any work was done": safe even for non-idempotent requests.
NOT_PROCESSED_STATUSES = frozenset({429, 503, 529})
# 5xx that say "this server cannot do that" rather than "try again": 501 Not Implemented,
# 505 HTTP Version Not Supported. A retry gets the same answer.
NEVER_RETRIED_STATUSES = frozenset({501, 505})
# Mid-stream `event: error` bodies carry a type, not a status; map the official types back.
ERROR_TYPE_STATUS = {
    "invalid_request_error": 400, "authentication_error": 401, "billing_error": 402,
    "permission_error": 403, "not_found_error": 404, "conflict_error": 409, "request_too_large": 413,
    "rate_limit_error": 429, "api_error": 500, "timeout_error": 504, "overloaded_error": 529,
    "server_error": 500,     # OpenAI's type for server-side errors (zgtool's overloaded: code "overloaded")
}

# Failure kinds, from "never left this machine" to "broke after the answer began".
CONNECT = "connect"              # no connection: the server never saw the request
TIMEOUT = "timeout"              # sent, no (complete) answer within the attempt timeout
CONNECTION_LOST = "connection_lost"  # connection dropped or stream ended early
STATUS = "status"                # an HTTP error status (or an error event in a stream)
TLS_VERIFY = "tls_verify"        # the server's certificate did not verify: the same on every attempt


@dataclass(frozen=True)
class RetryConfig:
    max_attempts: int = 4
    base_delay_s: float = 0.5     # backoff: full jitter over [0, min(max_delay_s, base * 2**n)]
    max_delay_s: float = 8.0
    max_wait_s: float = 60.0      # a server asking for a longer wait is not waited out: we give up
    deadline_s: float | None = None  # overall budget for all attempts and waits of one request

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ValueError(f"max_attempts must be >= 1, not {self.max_attempts}")
        if self.base_delay_s < 0 or self.max_delay_s < 0 or self.max_wait_s < 0:
            raise ValueError("delays must be >= 0")
        if self.deadline_s is not None and self.deadline_s <= 0:
            raise ValueError(f"deadline_s must be > 0, not {self.deadline_s}")


@dataclass(frozen=True)
class Failure:
    """One failed attempt, described independently of the SDK that saw it."""

    kind: str
    message: str
    status: int | None = None
    error_type: str | None = None
    headers: Mapping[str, str] = field(default_factory=dict)
    content_delivered: bool = False
    partial_text: str = ""
    timed_out: bool = False  # e.g. a connect timeout: kind CONNECT (never sent), yet a sign of overload

    @property
    def effective_status(self) -> int | None:
        if self.status is not None and self.status >= 400:
            return self.status
        return ERROR_TYPE_STATUS.get(self.error_type or "")

    @property
    def is_timeout(self) -> bool:
        return self.timed_out or self.kind == TIMEOUT or self.effective_status in (408, 504)


@dataclass(frozen=True)
class Decision:
    retry: bool
    wait_s: float
    reason: str


@dataclass(frozen=True)
class Attempt:
    """The record of one attempt: what was sent, what came back, what we did next."""

    number: int
    model: str
    outcome: str                 # "ok" or a failure kind
    status: int | None
    duration_ms: float
    retried: bool = False
    wait_s: float = 0.0          # wait before the next attempt
    reason: str = ""             # why it was (not) retried
    error_type: str | None = None
    message: str = ""
    request_id: str | None = None
    content_delivered: bool = False
    load_hint: LoadHint | None = None


def backoff_s(retry_index: int, config: RetryConfig, rng: random.Random) -> float:
    """Full jitter: uniform over [0, min(cap, base * 2**n)] spreads synchronized clients apart."""
    ceiling = min(config.max_delay_s, config.base_delay_s * (2.0 ** min(retry_index, 60)))
    return rng.uniform(0.0, ceiling)


def _retryable(failure: Failure, idempotent: bool) -> tuple[bool, str]:
    if failure.content_delivered:
        return False, "stream already delivered content; a retry would duplicate it"
    should = (header_value(failure.headers, "x-should-retry") or "").strip().lower()
    if should == "false":
        return False, "server sent x-should-retry: false"
    if should == "true":
        return True, "server sent x-should-retry: true"
    if failure.kind == TLS_VERIFY:
        return False, "the certificate did not verify; a retry gets the same certificate"
    if failure.kind == CONNECT:
        return True, "connection failed before the request was sent"
    if failure.kind in (TIMEOUT, CONNECTION_LOST):
        if not idempotent:
            return False, f"{failure.kind} after sending a non-idempotent request (it may have run)"
        return True, failure.kind.replace("_", " ")
    status = failure.effective_status
    if status is None:
        return False, f"not retryable: {failure.message}"
    if status in NEVER_RETRIED_STATUSES:
        return False, f"{status} is not retryable: the server does not implement this"
    if status in RETRYABLE_STATUSES or status >= 500:
        if not idempotent and status not in NOT_PROCESSED_STATUSES:
            return False, f"{status} on a non-idempotent request (it may have run)"
        return True, f"{status}{' ' + failure.error_type if failure.error_type else ''}"
    return False, f"{status} is not retryable"


def decide(failure: Failure, attempt_number: int, config: RetryConfig, *, idempotent: bool = True,
           elapsed_s: float = 0.0, rng: random.Random | None = None) -> Decision:
    """Retry this failed attempt (1-based attempt_number)? And after how long?"""
    ok, reason = _retryable(failure, idempotent)
    if not ok:
        return Decision(False, 0.0, reason)
    if attempt_number >= config.max_attempts:
        return Decision(False, 0.0, f"{reason}; gave up after {attempt_number} attempt(s)")
    asked = parse_retry_after_s(failure.headers)
    if asked is not None and asked > config.max_wait_s:
        return Decision(False, 0.0, f"{reason}; server asked to wait {asked:.1f} s > max_wait_s "
                                    f"{config.max_wait_s:.1f} s")
    if asked is not None:
        wait, how = asked, "retry-after"
    else:
        wait, how = backoff_s(attempt_number - 1, config, rng or random.Random()), "backoff"
    if config.deadline_s is not None and elapsed_s + wait >= config.deadline_s:
        return Decision(False, 0.0, f"{reason}; waiting {wait:.2f} s would pass the "
                                    f"{config.deadline_s:.1f} s deadline")
    return Decision(True, wait, f"{reason}; {how} {wait:.3f} s")

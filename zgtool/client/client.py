"""Client: one logical request -> attempts (recorded), honest retries, model chosen by the policy."""

from __future__ import annotations

import logging
import random
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from zgtool.client.backends import AttemptFailed, Backend, Reply, TextCallback, make_backend
from zgtool.client.hints import LoadHint, RateLimits, parse_load_hint, parse_rate_limits
from zgtool.client.policy import AutoFallbackPolicy, Observation, Switch
from zgtool.client.retry import Attempt, Failure, RetryConfig, decide
from zgtool.targets import Target

log = logging.getLogger("zgtool.client")

IDEMPOTENCY_HEADER = "Idempotency-Key"


@dataclass(frozen=True)
class AskResult:
    ok: bool
    text: str
    model: str | None              # the model the last attempt asked for
    served_model: str | None       # the model the server says answered
    attempts: tuple[Attempt, ...]
    switches: tuple[Switch, ...]   # policy switches made while this request ran
    load_hint: LoadHint | None     # the last one seen
    rate_limits: RateLimits = field(default_factory=RateLimits)
    request_id: str | None = None
    stop_reason: str | None = None
    input_tokens: int | None = None
    output_tokens: int | None = None
    idempotency_key: str = ""
    idempotent: bool = True
    stream: bool = False
    total_ms: float = 0.0
    error: str | None = None
    content_delivered: bool = False

    @property
    def total_wait_s(self) -> float:
        return sum(a.wait_s for a in self.attempts)


class RequestFailed(Exception):
    """Every allowed attempt failed, or the failure was not retryable; `result` holds the attempts."""

    def __init__(self, message: str, result: AskResult, failure: Failure) -> None:
        super().__init__(message)
        self.result = result
        self.failure = failure


class Client:
    """Wraps an official SDK client (its retries disabled) so that every attempt is ours and recorded.

    `policy` (shared between requests) picks the model per attempt; without it the
    target's model is used. `sleep` and `rng` are injectable so callers embedding this
    in an event loop or a simulation control waiting.
    """

    def __init__(self, target: Target | str, *, policy: AutoFallbackPolicy | None = None,
                 retry: RetryConfig | None = None, timeout_s: float = 60.0, backend: Backend | None = None,
                 sleep: Callable[[float], None] = time.sleep, rng: random.Random | None = None,
                 verify: bool | str = True) -> None:
        if isinstance(target, str):
            from zgtool.targets import resolve

            target = resolve(target)
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be > 0, not {timeout_s}")
        self.target = target
        self.policy = policy
        self.retry = retry or RetryConfig()
        self.timeout_s = timeout_s
        self._backend = backend or make_backend(target, timeout_s, verify)
        self._sleep = sleep
        self._rng = rng or random.Random()

    def close(self) -> None:
        self._backend.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def ask(self, prompt: str, **kwargs: Any) -> AskResult:
        return self.create([{"role": "user", "content": prompt}], **kwargs)

    def create(self, messages: list[dict[str, Any]], *, max_tokens: int = 256, model: str | None = None,
               system: str | None = None, stream: bool = False, on_text: TextCallback | None = None,
               idempotent: bool = True, idempotency_key: str | None = None) -> AskResult:
        """Run one request. `idempotent=False` limits retries to failures where the server surely did
        not run it. The same Idempotency-Key goes with every attempt so a deduplicating server can
        tell retries apart from new requests. Raises RequestFailed with the full record on failure."""
        key = idempotency_key or f"zgtool-{uuid.uuid4()}"
        headers = {IDEMPOTENCY_HEADER: key}
        started = time.monotonic()
        switches_before = len(self.policy.switches) if self.policy is not None else 0
        attempts: list[Attempt] = []
        hint: LoadHint | None = None
        limits = RateLimits()
        number = 0
        while True:
            number += 1
            chosen = model or (self.policy.choose() if self.policy is not None else self.target.model)
            t0 = time.monotonic()
            try:
                reply = self._backend.send(model=chosen, messages=messages, system=system,
                                           max_tokens=max_tokens, stream=stream, on_text=on_text,
                                           timeout_s=self._attempt_timeout_s(started), headers=headers)
            except AttemptFailed as af:
                failure = af.failure
                duration_ms = (time.monotonic() - t0) * 1000.0
                attempt_hint = parse_load_hint(failure.headers)
                hint = attempt_hint or hint
                limits = _merge_limits(limits, parse_rate_limits(failure.headers))
                self._observe(model, chosen, ok=False, timed_out=failure.is_timeout, hint=attempt_hint)
                decision = decide(failure, number, self.retry, idempotent=idempotent,
                                  elapsed_s=time.monotonic() - started, rng=self._rng)
                attempts.append(Attempt(number, chosen, failure.kind, failure.status, duration_ms,
                                        decision.retry, decision.wait_s, decision.reason, failure.error_type,
                                        failure.message, failure.headers.get("request-id"),
                                        failure.content_delivered, attempt_hint))
                log.debug("attempt %d (%s): %s -> %s", number, chosen, failure.message, decision.reason)
                if not decision.retry:
                    result = self._result(False, failure.partial_text, chosen, None, attempts, switches_before,
                                          hint, limits, key, idempotent, stream, started,
                                          error=f"{failure.message} ({decision.reason})",
                                          content_delivered=failure.content_delivered)
                    raise RequestFailed(f"request failed after {number} attempt(s): {failure.message}; "
                                        f"{decision.reason}", result, failure) from af
                self._sleep(decision.wait_s)
                continue
            duration_ms = (time.monotonic() - t0) * 1000.0
            attempt_hint = parse_load_hint(reply.headers)
            hint = attempt_hint or hint
            limits = _merge_limits(limits, parse_rate_limits(reply.headers))
            self._observe(model, chosen, ok=True, timed_out=False, hint=attempt_hint)
            attempts.append(Attempt(number, chosen, "ok", reply.status, duration_ms, reason="ok",
                                    request_id=reply.request_id, content_delivered=bool(reply.text),
                                    load_hint=attempt_hint))
            return self._result(True, reply.text, chosen, reply, attempts, switches_before, hint, limits, key,
                                idempotent, stream, started)

    def _attempt_timeout_s(self, started: float) -> float:
        if self.retry.deadline_s is None:
            return self.timeout_s
        left = self.retry.deadline_s - (time.monotonic() - started)
        return max(0.001, min(self.timeout_s, left))

    def _observe(self, explicit_model: str | None, chosen: str, *, ok: bool, timed_out: bool,
                 hint: LoadHint | None) -> None:
        # A caller who pinned the model opted out of steering; its outcomes are not policy evidence.
        if self.policy is not None and explicit_model is None:
            self.policy.observe(Observation(chosen, ok=ok, timed_out=timed_out, hint=hint))

    def _result(self, ok: bool, text: str, chosen: str, reply: Reply | None, attempts: list[Attempt],
                switches_before: int, hint: LoadHint | None, limits: RateLimits, key: str,
                idempotent: bool, stream: bool, started: float, *, error: str | None = None,
                content_delivered: bool = False) -> AskResult:
        switches = tuple(self.policy.switches[switches_before:]) if self.policy is not None else ()
        return AskResult(
            ok=ok, text=text, model=chosen, served_model=reply.model if reply else None,
            attempts=tuple(attempts), switches=switches, load_hint=hint, rate_limits=limits,
            request_id=reply.request_id if reply else None, stop_reason=reply.stop_reason if reply else None,
            input_tokens=reply.input_tokens if reply else None,
            output_tokens=reply.output_tokens if reply else None, idempotency_key=key, idempotent=idempotent,
            stream=stream, total_ms=(time.monotonic() - started) * 1000.0, error=error,
            content_delivered=content_delivered or bool(reply and reply.text))


def _merge_limits(old: RateLimits, new: RateLimits) -> RateLimits:
    """The latest answer's figures win; buckets it did not report keep their last value."""
    if new.is_empty():
        return old
    return RateLimits(buckets={**old.buckets, **new.buckets},
                      retry_after_s=new.retry_after_s if new.retry_after_s is not None else old.retry_after_s)

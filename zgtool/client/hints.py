"""Typed views of the load and rate-limit headers an endpoint sends back.

Parsing is tolerant by design: a missing, malformed or partly wrong header is
ignored (with a debug log) and never raises, because a client must keep working
against endpoints that send nothing, or something odd, in these headers.
"""

from __future__ import annotations

import email.utils
import json
import logging
import math
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger("zgtool.client.hints")

LOAD_HINT_HEADER = "x-gpu-load-hint"

# Anthropic: anthropic-ratelimit-<bucket>-<limit|remaining|reset>;
# OpenAI-compatible servers: x-ratelimit-<limit|remaining|reset>-<bucket>.
_ANTHROPIC_BUCKETS = ("requests", "tokens", "input-tokens", "output-tokens")
_OPENAI_BUCKETS = ("requests", "tokens")
_FIELDS = ("limit", "remaining", "reset")


@dataclass(frozen=True)
class LoadHint:
    """The engine's own view of its load (X-GPU-Load-Hint); None = not reported."""

    kv_util: float | None = None  # fraction 0..1 of KV blocks in use
    running: int | None = None
    waiting: int | None = None
    sm_util: float | None = None  # percent 0..100 (NVML convention), GPU engines only
    vram_free_gb: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def util_pct(self) -> float | None:
        """The load figure the fallback policy compares: sm_util on GPU engines, else kv_util."""
        if self.sm_util is not None:
            return self.sm_util
        if self.kv_util is not None:
            return self.kv_util * 100.0
        return None


@dataclass(frozen=True)
class RateBucket:
    limit: int | None = None
    remaining: int | None = None
    reset: str | None = None  # RFC 3339 (Anthropic) or a duration like "1s" (OpenAI); kept verbatim


@dataclass(frozen=True)
class RateLimits:
    buckets: dict[str, RateBucket] = field(default_factory=dict)
    retry_after_s: float | None = None

    def is_empty(self) -> bool:
        return not self.buckets and self.retry_after_s is None


def header_value(headers: Mapping[str, str] | None, name: str) -> str | None:
    """Case-insensitive header lookup that works on httpx headers and plain dicts alike."""
    if not headers:
        return None
    try:
        value = headers.get(name)
        if value is None:
            value = next((v for k, v in headers.items() if str(k).lower() == name), None)
    except Exception as exc:  # a broken mapping must not break a request
        log.debug("cannot read header %s: %s", name, exc)
        return None
    return None if value is None else str(value)


def _number(name: str, value: Any, *, lo: float = 0.0, hi: float | None = None) -> float | None:
    # bool is an int subclass; "true" is not a utilisation.
    if isinstance(value, bool) or not isinstance(value, int | float):
        log.debug("load hint %s=%r is not a number; ignored", name, value)
        return None
    v = float(value)
    if math.isnan(v) or math.isinf(v) or v < lo or (hi is not None and v > hi):
        log.debug("load hint %s=%r is out of range; ignored", name, value)
        return None
    return v


def _count(name: str, value: Any) -> int | None:
    v = _number(name, value)
    if v is None:
        return None
    if v != int(v):
        log.debug("load hint %s=%r is not a whole number; ignored", name, value)
        return None
    return int(v)


def parse_load_hint(headers: Mapping[str, str] | None) -> LoadHint | None:
    """X-GPU-Load-Hint -> LoadHint, or None when absent or unusable."""
    raw = header_value(headers, LOAD_HINT_HEADER)
    if raw is None:
        return None
    try:
        doc = json.loads(raw)
    except (ValueError, RecursionError) as exc:
        log.debug("malformed %s header %r: %s; ignored", LOAD_HINT_HEADER, raw[:200], exc)
        return None
    if not isinstance(doc, dict):
        log.debug("%s header is not a JSON object (%r); ignored", LOAD_HINT_HEADER, raw[:200])
        return None
    known = {"kv_util", "running", "waiting", "sm_util", "vram_free_gb"}
    hint = LoadHint(
        kv_util=_number("kv_util", doc["kv_util"], hi=1.0) if doc.get("kv_util") is not None else None,
        running=_count("running", doc["running"]) if doc.get("running") is not None else None,
        waiting=_count("waiting", doc["waiting"]) if doc.get("waiting") is not None else None,
        sm_util=_number("sm_util", doc["sm_util"], hi=100.0) if doc.get("sm_util") is not None else None,
        vram_free_gb=(_number("vram_free_gb", doc["vram_free_gb"])
                      if doc.get("vram_free_gb") is not None else None),
        extra={str(k): v for k, v in doc.items() if k not in known},
    )
    if hint.util_pct is None and hint.running is None and hint.waiting is None and hint.vram_free_gb is None:
        log.debug("%s header carried no usable field (%r); ignored", LOAD_HINT_HEADER, raw[:200])
        return None
    return hint


def _int_header(headers: Mapping[str, str] | None, name: str) -> int | None:
    raw = header_value(headers, name)
    if raw is None:
        return None
    try:
        return int(raw.strip())
    except ValueError:
        log.debug("header %s=%r is not an integer; ignored", name, raw)
        return None


def parse_retry_after_s(headers: Mapping[str, str] | None, *, now: float | None = None) -> float | None:
    """retry-after-ms, then retry-after (seconds or an HTTP date); None when absent or unusable."""
    ms = header_value(headers, "retry-after-ms")
    if ms is not None:
        try:
            v = float(ms) / 1000.0
            if v >= 0 and v == v and v != float("inf"):
                return v
        except ValueError:
            pass
    raw = header_value(headers, "retry-after")
    if raw is None:
        return None
    try:
        v = float(raw)
        if v >= 0 and v == v and v != float("inf"):
            return v
        return None
    except ValueError:
        pass
    parsed = email.utils.parsedate_tz(raw)
    if parsed is None:
        return None
    return max(0.0, float(email.utils.mktime_tz(parsed)) - (time.time() if now is None else now))


def parse_rate_limits(headers: Mapping[str, str] | None) -> RateLimits:
    """anthropic-ratelimit-*, x-ratelimit-* and retry-after -> RateLimits (empty when none)."""
    buckets: dict[str, RateBucket] = {}
    for bucket in _ANTHROPIC_BUCKETS:
        prefix = f"anthropic-ratelimit-{bucket}-"
        b = RateBucket(
            limit=_int_header(headers, prefix + "limit"),
            remaining=_int_header(headers, prefix + "remaining"),
            reset=header_value(headers, prefix + "reset"),
        )
        if b != RateBucket():
            buckets[bucket] = b
    for bucket in _OPENAI_BUCKETS:
        b = RateBucket(
            limit=_int_header(headers, f"x-ratelimit-limit-{bucket}"),
            remaining=_int_header(headers, f"x-ratelimit-remaining-{bucket}"),
            reset=header_value(headers, f"x-ratelimit-reset-{bucket}"),
        )
        if b != RateBucket():
            buckets.setdefault(bucket, b)
    return RateLimits(buckets=buckets, retry_after_s=parse_retry_after_s(headers))

"""Admission: API keys, tiers (concurrency, requests/min, tokens/min) and load-aware caps.

Plain Python, no torch, called on the I/O loop only (no locks). The keys file and the
constant-time key match are zgtool.http.keys (shared with pygw); keys are never logged.

Load-aware caps: when the engine's load (max of kv_util and, on a GPU, sm_util) stays
above 0.9 for ``hold_s``, every tier's concurrency cap is halved (at least 1) until the
load has stayed below 0.9 for ``hold_s`` again. The factor is in X-GPU-Load-Hint.
"""

from __future__ import annotations

import math
import time
from collections import deque
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from zgtool.engine.server.errors import HttpError
from zgtool.http.keys import KeysConfig, Tier, api_key

WINDOW_S = 60.0
LOAD_HIGH = 0.9


@dataclass
class KeyState:
    """Sliding-window counters of one key."""

    in_flight: int = 0
    events: deque[tuple[float, int, int]] = field(default_factory=deque)   # (t, requests, tokens)
    requests: int = 0
    tokens: int = 0

    def prune(self, now: float) -> None:
        ev = self.events
        while ev and now - ev[0][0] >= WINDOW_S:
            _, r, t = ev.popleft()
            self.requests -= r
            self.tokens -= t

    def add(self, now: float, requests: int, tokens: int) -> None:
        self.events.append((now, requests, tokens))
        self.requests += requests
        self.tokens += tokens

    def reset_at(self, now: float) -> float:
        return (self.events[0][0] + WINDOW_S) if self.events else now


@dataclass
class Principal:
    name: str
    tier: Tier | None
    is_admin: bool
    state: KeyState
    is_gateway: bool = False     # a gateway's key (keys.toml gateway = true): it names its client's key



class Admission:
    def __init__(self, keys: KeysConfig | None, hold_s: float = 1.0) -> None:
        self.keys = keys
        self.hold_s = hold_s
        self.cap_factor = 1.0
        self._since_cross: float | None = None
        self._load_stats: dict[str, Any] | None = None    # the stats update_load last saw
        self._anon = Principal("anonymous", None, True, KeyState())
        self._states: dict[str, KeyState] = {}
        self.ema_e2e_s = 0.0

    @property
    def open(self) -> bool:
        return self.keys is None

    def authenticate(self, headers: dict[bytes, bytes]) -> Principal:
        """x-api-key or Authorization: Bearer; 401 when keys are configured and none match."""
        if self.keys is None:
            return self._anon
        raw = api_key(headers)
        if not raw:
            raise HttpError(401, "authentication_error", "missing API key: send x-api-key or Authorization: Bearer")
        found, is_admin = self.keys.match(raw)
        if found is None and not is_admin:
            raise HttpError(401, "authentication_error", "invalid x-api-key")
        if found is None:
            return Principal("admin", None, True, self._states.setdefault("\0admin", KeyState()))
        return Principal(found.name, self.keys.tiers[found.tier], is_admin,
                         self._states.setdefault(found.name, KeyState()), found.gateway)

    def update_load(self, stats: dict[str, Any], now: float) -> None:
        """Halve tier caps while load stays > 0.9; restore after it stays below for hold_s."""
        if stats is self._load_stats and self._since_cross is None:
            return      # the same figures (the app refreshes them every few ms) and no change pending
        self._load_stats = stats
        # sm_util is NVML's percentage (None on CPU); kv_util is a fraction.
        load = max(float(stats.get("kv_util") or 0.0), float(stats.get("sm_util") or 0.0) / 100.0)
        high = load > LOAD_HIGH
        reduced = self.cap_factor < 1.0
        if high != reduced:               # the load disagrees with the current factor
            if self._since_cross is None:
                self._since_cross = now
            elif now - self._since_cross >= self.hold_s:
                self.cap_factor = 0.5 if high else 1.0
                self._since_cross = None
        else:
            self._since_cross = None

    def concurrency_cap(self, tier: Tier) -> int:
        if not tier.max_concurrent:
            return 0
        return max(1, math.floor(tier.max_concurrent * self.cap_factor))

    def retry_after_s(self, stats: dict[str, Any]) -> int:
        """Seconds until a slot is likely free: recent e2e latency scaled by the queue."""
        running = max(1, int(stats.get("running") or 0))
        waiting = int(stats.get("waiting") or 0)
        return max(1, math.ceil(self.ema_e2e_s * (1.0 + waiting / running)))

    def admit(self, p: Principal, prompt_tokens: int, stats: dict[str, Any], now: float) -> None:
        """Count the request against its key, or raise 429 with retry-after + rate-limit headers."""
        tier = p.tier
        st = p.state
        if tier is not None:
            st.prune(now)
            cap = self.concurrency_cap(tier)
            why = None
            retry = 1
            if cap and st.in_flight >= cap:
                why = f"concurrency limit of {cap} requests in flight for tier {tier.name!r}"
                if self.cap_factor < 1.0:
                    why += f" (halved from {tier.max_concurrent}: engine load above {LOAD_HIGH:.0%})"
                retry = self.retry_after_s(stats)
            elif tier.requests_per_min and st.requests >= tier.requests_per_min:
                why = f"{tier.requests_per_min} requests per minute for tier {tier.name!r}"
                retry = max(1, math.ceil(st.reset_at(now) - now))
            elif tier.tokens_per_min and st.tokens + prompt_tokens > tier.tokens_per_min:
                why = f"{tier.tokens_per_min} tokens per minute for tier {tier.name!r}"
                retry = max(1, math.ceil(st.reset_at(now) - now))
            if why is not None:
                headers = [(b"retry-after", str(retry).encode())] + self.ratelimit_headers(p, now)
                raise HttpError(429, "rate_limit_error", f"rate limit exceeded: {why}; retry after {retry}s",
                                headers=headers)
            st.add(now, 1, prompt_tokens)
        st.in_flight += 1

    def release(self, p: Principal, completion_tokens: int, e2e_s: float | None, now: float) -> None:
        st = p.state
        st.in_flight -= 1
        if p.tier is not None and completion_tokens:
            st.add(now, 0, completion_tokens)
        if e2e_s is not None:
            self.ema_e2e_s = e2e_s if self.ema_e2e_s == 0.0 else 0.8 * self.ema_e2e_s + 0.2 * e2e_s

    def ratelimit_headers(self, p: Principal, now: float) -> list[tuple[bytes, bytes]]:
        tier = p.tier
        if tier is None:
            return []
        st = p.state
        reset = datetime.fromtimestamp(time.time() + (st.reset_at(now) - now), UTC).strftime(
            "%Y-%m-%dT%H:%M:%SZ").encode()
        out: list[tuple[bytes, bytes]] = []
        if tier.requests_per_min:
            out += [
                (b"anthropic-ratelimit-requests-limit", str(tier.requests_per_min).encode()),
                (b"anthropic-ratelimit-requests-remaining", str(max(0, tier.requests_per_min - st.requests)).encode()),
                (b"anthropic-ratelimit-requests-reset", reset),
            ]
        if tier.tokens_per_min:
            out += [
                (b"anthropic-ratelimit-tokens-limit", str(tier.tokens_per_min).encode()),
                (b"anthropic-ratelimit-tokens-remaining", str(max(0, tier.tokens_per_min - st.tokens)).encode()),
                (b"anthropic-ratelimit-tokens-reset", reset),
            ]
        if tier.max_concurrent:
            cap = self.concurrency_cap(tier)
            out += [
                (b"x-ratelimit-concurrency-limit", str(cap).encode()),
                (b"x-ratelimit-concurrency-remaining", str(max(0, cap - st.in_flight)).encode()),
            ]
        return out

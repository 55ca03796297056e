"""pygw's shared state: per-key token buckets and the exact-match response cache,
in memory (one process) or in Redis (shared by every gateway process using the URL)."""

from __future__ import annotations

import logging
import time
from collections import OrderedDict, deque
from dataclasses import dataclass
from typing import Any

log = logging.getLogger("pygw")


@dataclass(frozen=True)
class Decision:
    allowed: bool
    remaining: int
    retry_after_s: float  # 0 when allowed


class MemoryLimiter:
    """Token bucket per key: `burst` tokens, refilled at rpm/60 per second.

    Bounded: a bucket that has refilled completely is the same as no bucket, so buckets
    idle for longer than their refill time are dropped, and at most `max_keys` are held
    (least recently used first out). An open gateway sees any number of presented keys."""

    def __init__(self, max_keys: int = 50_000) -> None:
        self._buckets: OrderedDict[str, tuple[float, float, float]] = OrderedDict()  # tokens, ts, full-at
        self._max = max_keys

    def __len__(self) -> int:
        return len(self._buckets)

    async def acquire(self, key: str, rpm: float, burst: int) -> Decision:
        now = time.monotonic()
        rate = rpm / 60.0
        item = self._buckets.pop(key, None)
        tokens, ts = (float(burst), now) if item is None else item[:2]
        tokens = min(float(burst), tokens + (now - ts) * rate)
        allowed = tokens >= 1.0
        if allowed:
            tokens -= 1.0
        self._buckets[key] = (tokens, now, now + (burst - tokens) / rate)
        self._evict(now)
        if allowed:
            return Decision(True, int(tokens), 0.0)
        return Decision(False, 0, (1.0 - tokens) / rate)

    def _evict(self, now: float) -> None:
        b = self._buckets
        while b:  # the oldest entries first: drop those refilled by now, and any over the cap
            key, (_, _, full_at) = next(iter(b.items()))
            if full_at > now and len(b) <= self._max:
                break
            del b[key]


class TierUsage:
    """Per-key concurrency and a 60 s sliding window of tokens, for tiers that set
    max_concurrent or tokens_per_min (memory, per pygw process). Tokens are the upstream's
    own usage (input + output), charged when an answer completes; a key is refused
    while its window holds tokens_per_min or more."""

    WINDOW_S = 60.0

    def __init__(self) -> None:
        self._in_flight: dict[str, int] = {}
        self._tokens: dict[str, deque[tuple[float, int]]] = {}

    def in_flight(self, key: str) -> int:
        return self._in_flight.get(key, 0)

    def tokens(self, key: str, now: float | None = None) -> int:
        ev = self._tokens.get(key)
        if not ev:
            return 0
        now = time.monotonic() if now is None else now
        while ev and now - ev[0][0] >= self.WINDOW_S:
            ev.popleft()
        if not ev:
            del self._tokens[key]
            return 0
        return sum(n for _, n in ev)

    def token_reset_s(self, key: str) -> float:
        ev = self._tokens.get(key)
        return max(0.0, ev[0][0] + self.WINDOW_S - time.monotonic()) if ev else 0.0

    def enter(self, key: str) -> None:
        self._in_flight[key] = self._in_flight.get(key, 0) + 1

    def leave(self, key: str, tokens: int = 0, *, count_tokens: bool = False) -> None:
        n = self._in_flight.get(key, 0) - 1
        if n > 0:
            self._in_flight[key] = n
        else:
            self._in_flight.pop(key, None)
        if count_tokens and tokens > 0:
            self._tokens.setdefault(key, deque()).append((time.monotonic(), tokens))


# One atomic step of the bucket inside Redis; the clock is Redis's own TIME so that
# gateways on different hosts agree. Floats travel as strings (Lua numbers -> ints).
_BUCKET_LUA = """
local rate = tonumber(ARGV[1])
local cap = tonumber(ARGV[2])
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local v = redis.call('HMGET', KEYS[1], 'tokens', 'ts')
local tokens = tonumber(v[1])
local ts = tonumber(v[2])
if tokens == nil then tokens = cap; ts = now end
tokens = math.min(cap, tokens + math.max(0, now - ts) * rate)
local ok = 0
local retry = 0
if tokens >= 1 then tokens = tokens - 1; ok = 1 else retry = (1 - tokens) / rate end
redis.call('HSET', KEYS[1], 'tokens', tostring(tokens), 'ts', tostring(now))
redis.call('PEXPIRE', KEYS[1], math.ceil(cap / rate * 1000) + 1000)
return {ok, tostring(tokens), tostring(retry)}
"""


class RedisLimiter:
    def __init__(self, client: Any, prefix: str = "zgtool:pygw:rl:") -> None:
        self._r = client
        self._prefix = prefix
        self._script = client.register_script(_BUCKET_LUA)

    async def acquire(self, key: str, rpm: float, burst: int) -> Decision:
        try:
            ok, tokens, retry = await self._script(keys=[self._prefix + key], args=[rpm / 60.0, burst])
        except Exception as exc:  # fail open: an unreachable Redis must not take the API down
            log.warning("rate limiter unavailable, allowing request: %s", exc)
            return Decision(True, burst, 0.0)
        return Decision(bool(int(ok)), int(float(tokens)), float(retry))


@dataclass(frozen=True)
class CachedResponse:
    content_type: str
    body: bytes


class MemoryCache:
    """Bounded LRU with a TTL per entry."""

    def __init__(self, ttl_s: float, max_entries: int = 10_000) -> None:
        self._ttl_s = ttl_s
        self._max = max_entries
        self._items: OrderedDict[str, tuple[float, CachedResponse]] = OrderedDict()

    async def get(self, key: str) -> CachedResponse | None:
        item = self._items.get(key)
        if item is None:
            return None
        expires, value = item
        if expires < time.monotonic():
            del self._items[key]
            return None
        self._items.move_to_end(key)
        return value

    async def put(self, key: str, value: CachedResponse) -> None:
        self._items[key] = (time.monotonic() + self._ttl_s, value)
        self._items.move_to_end(key)
        while len(self._items) > self._max:
            self._items.popitem(last=False)


class RedisCache:
    def __init__(self, client: Any, ttl_s: float, prefix: str = "zgtool:pygw:cache:") -> None:
        self._r = client
        self._ttl_ms = max(1, int(ttl_s * 1000))
        self._prefix = prefix

    async def get(self, key: str) -> CachedResponse | None:
        try:
            raw = await self._r.get(self._prefix + key)
        except Exception as exc:  # a cache outage is a miss, not an error
            log.warning("cache unavailable: %s", exc)
            return None
        if raw is None:
            return None
        ctype, _, body = bytes(raw).partition(b"\n")
        return CachedResponse(ctype.decode(), body)

    async def put(self, key: str, value: CachedResponse) -> None:
        try:
            await self._r.set(self._prefix + key, value.content_type.encode() + b"\n" + value.body, px=self._ttl_ms)
        except Exception as exc:
            log.warning("cache unavailable: %s", exc)

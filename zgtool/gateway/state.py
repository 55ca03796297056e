"""pygw's shared state: per-key token buckets and the exact-match response cache,
in memory (one process) or in Redis (shared by every gateway process using the URL)."""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

log = logging.getLogger("pygw")


@dataclass(frozen=True)
class Decision:
    allowed: bool
    remaining: int
    retry_after_s: float  # 0 when allowed


class MemoryLimiter:
    """Token bucket per key: `burst` tokens, refilled at rpm/60 per second."""

    def __init__(self) -> None:
        self._buckets: dict[str, tuple[float, float]] = {}

    async def acquire(self, key: str, rpm: float, burst: int) -> Decision:
        now = time.monotonic()
        rate = rpm / 60.0
        tokens, ts = self._buckets.get(key, (float(burst), now))
        tokens = min(float(burst), tokens + (now - ts) * rate)
        if tokens >= 1.0:
            self._buckets[key] = (tokens - 1.0, now)
            return Decision(True, int(tokens - 1.0), 0.0)
        self._buckets[key] = (tokens, now)
        return Decision(False, 0, (1.0 - tokens) / rate)


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

"""The engine's prefix-cache hit rate over a run, from its Prometheus /metrics counters read before and after.

zgtool serve: zg_prefix_cache_hits / zg_prefix_cache_queries (prompt tokens found / looked up);
vLLM v1: vllm:prefix_cache_hits / vllm:prefix_cache_queries (also tokens). prometheus_client writes a
counter with a _total suffix; both spellings are read, summed over label sets (models, engines).
"""

from __future__ import annotations

import functools
import ssl
import threading
import urllib.request
from bisect import bisect_right
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit, urlunsplit

HITS = ("zg_prefix_cache_hits", "vllm:prefix_cache_hits")
QUERIES = ("zg_prefix_cache_queries", "vllm:prefix_cache_queries")


@dataclass(frozen=True)
class Counters:
    hits: float
    queries: float
    source: str                         # which family answered: zgtool | vLLM


def parse(text: str) -> Counters | None:
    """The prefix-cache counters of an exposition, or None when it has none."""
    sums = {name: 0.0 for name in HITS + QUERIES}
    seen: set[str] = set()
    for line in text.splitlines():
        if not line or line[0] == "#":
            continue
        end = min((i for i in (line.find("{"), line.find(" ")) if i >= 0), default=-1)
        if end < 0:
            continue
        name = line[:end].removesuffix("_total")
        if name in sums:
            try:
                sums[name] += float(line.rsplit("}", 1)[-1].split()[0])
            except (ValueError, IndexError):
                continue
            seen.add(name)
    for hits, queries in zip(HITS, QUERIES, strict=True):
        if queries in seen:
            return Counters(sums[hits], sums[queries], "zgtool" if hits.startswith("zg_") else "vLLM")
    return None


def read(url: str, timeout_s: float = 3.0, ctx: ssl.SSLContext | None = None) -> Counters | None:
    """GET url and parse it; None when it does not answer or has no prefix-cache counters."""
    try:
        with urllib.request.urlopen(url, timeout=timeout_s, context=ctx) as resp:  # noqa: S310 - the operator's URL
            return parse(resp.read().decode("utf-8", "replace"))
    except (OSError, ValueError):
        return None


def metrics_url(base_url: str) -> str:
    """A target's /metrics: its scheme, host and port (a /v1 base path dropped)."""
    p = urlsplit(base_url)
    return urlunsplit((p.scheme, p.netloc, "/metrics", "", ""))


class PrefixWatch:
    """The counters of each URL read around every block of measured requests, so each delta falls to the
    target whose block made it (blocks run one at a time, targets alternating).

    It works as one runner hook per target (`hooks()`). A block closes in the after() of its last answer
    (all of its requests done: `block_sizes` is the runner's split of -n into rounds), between blocks. In a
    closed-loop run a block opens in the before() of its first request: that scrape waits before any timed
    window, and leaves out the unmeasured requests that warm each block's connections. An open-loop run
    (--rate, a trace) must not delay a scheduled send, so its blocks open at the previous close (the first
    at hooks()): there the deltas also hold the warm-up requests (the default short prompt)."""

    def __init__(self, urls: list[str], ctx: ssl.SSLContext | None = None) -> None:
        self.urls = urls
        self.ctx = ctx                       # an https engine's trust settings (--cacert, --insecure)
        self.lock = threading.Lock()
        self.opened: str | None = None
        self.base: dict[str, Counters | None] = {}
        self.totals: dict[str, dict[str, list[float]]] = {u: {} for u in urls}   # url -> target -> [h, q]
        self.source: dict[str, str] = {}
        self.ends: list[int] = []            # cumulative request index at each block's end
        self.done: dict[tuple[str, int], int] = {}
        self.open_in_before = True

    def hooks(self, inner: list[Any] | None, targets: list[str], block_sizes: list[int],
              open_loop: bool = False) -> list[Any]:
        """One runner hook per target, chained after `inner`'s (e.g. vLLM's histogram deltas)."""
        self.ends = [sum(block_sizes[:i + 1]) for i in range(len(block_sizes))]
        self.open_in_before = not open_loop
        if open_loop:
            self.base = {u: read(u, ctx=self.ctx) for u in self.urls}
        inner = inner or [None] * len(targets)
        return [Chain(h, _TargetHook(self, name)) for h, name in zip(inner, targets, strict=True)]

    def _open(self, target: str) -> None:          # caller holds the lock
        if self.open_in_before:
            self.base = {u: read(u, ctx=self.ctx) for u in self.urls}
        self.opened = target

    def _close(self) -> None:                      # caller holds the lock
        snap = {u: read(u, ctx=self.ctx) for u in self.urls}
        if self.opened is not None:
            for u, now in snap.items():
                before = self.base.get(u)
                if now is None or before is None:
                    continue
                row = self.totals[u].setdefault(self.opened, [0.0, 0.0])
                row[0] += now.hits - before.hits
                row[1] += now.queries - before.queries
                self.source[u] = now.source
        self.base = snap
        self.opened = None

    def _answered(self, target: str, index: int) -> None:
        block = bisect_right(self.ends, index)
        if block >= len(self.ends):
            return
        size = self.ends[block] - (self.ends[block - 1] if block else 0)
        with self.lock:
            key = (target, block)
            self.done[key] = self.done.get(key, 0) + 1
            if self.done[key] == size:
                self._close()

    def finish(self) -> None:
        with self.lock:
            if self.opened is not None:
                self._close()

    def result(self) -> list[dict[str, Any]]:
        out = []
        for u in self.urls:
            per = self.totals[u]
            if not per:
                continue
            hits, queries = sum(v[0] for v in per.values()), sum(v[1] for v in per.values())
            out.append({"url": u, "source": self.source.get(u), **_rate(hits, queries),
                        "targets": {name: _rate(*v) for name, v in per.items()}})
        return out


def _rate(hits: float, queries: float) -> dict[str, Any]:
    return {"hit_tokens": hits, "query_tokens": queries, "hit_rate": hits / queries if queries > 0 else None}


class _TargetHook:
    __slots__ = ("watch", "name")

    def __init__(self, watch: PrefixWatch, name: str) -> None:
        self.watch = watch
        self.name = name

    def before(self) -> None:
        w = self.watch
        if w.opened != self.name:
            with w.lock:
                if w.opened != self.name:
                    w._open(self.name)

    def after(self, token: Any, sample: Any) -> None:
        self.watch._answered(self.name, sample.index)

    def unmeasured(self, send: Any) -> Any:
        return send()


class Chain:
    """Two runner hooks around the same request (e.g. vLLM's histogram deltas and this watch)."""

    def __init__(self, *hooks: Any) -> None:
        self.hooks = [h for h in hooks if h is not None]

    def before(self) -> list[Any]:
        return [h.before() for h in self.hooks]

    def after(self, token: list[Any], sample: Any) -> None:
        for h, t in zip(self.hooks, token, strict=True):
            h.after(t, sample)

    def unmeasured(self, send: Any) -> Any:
        for h in self.hooks:     # each hook wraps the ones before it
            send = functools.partial(h.unmeasured, send)
        return send()

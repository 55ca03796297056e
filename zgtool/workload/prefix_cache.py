"""The engine's prefix-cache hit rate over a run, from its Prometheus /metrics counters read before and after.

zgtool serve: zg_prefix_cache_hits / zg_prefix_cache_queries (prompt tokens found / looked up);
vLLM v1: vllm:prefix_cache_hits / vllm:prefix_cache_queries (also tokens). prometheus_client writes a
counter with a _total suffix; both spellings are read, summed over label sets (models, engines).
"""

from __future__ import annotations

import threading
import urllib.request
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


def read(url: str, timeout_s: float = 3.0) -> Counters | None:
    """GET url and parse it; None when it does not answer or has no prefix-cache counters."""
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as resp:  # noqa: S310 - the operator's URL
            return parse(resp.read().decode("utf-8", "replace"))
    except (OSError, ValueError):
        return None


def metrics_url(base_url: str) -> str:
    """A target's /metrics: its scheme, host and port (a /v1 base path dropped)."""
    p = urlsplit(base_url)
    return urlunsplit((p.scheme, p.netloc, "/metrics", "", ""))


class PrefixWatch:
    """Reads the counters of each URL once before the first measured request (a runner hook: its first
    before() call scrapes while the other workers wait on the lock, so warm-up stays outside) and once
    after the run; `result()` is the delta per URL."""

    def __init__(self, urls: list[str]) -> None:
        self.urls = urls
        self.lock = threading.Lock()
        self.start: dict[str, Counters | None] | None = None
        self.end: dict[str, Counters | None] = {}

    def before(self) -> None:
        with self.lock:
            if self.start is None:
                self.start = {u: read(u) for u in self.urls}

    def after(self, token: Any, sample: Any) -> None:
        return None

    def finish(self) -> None:
        self.end = {u: read(u) for u in self.urls}

    def result(self) -> list[dict[str, Any]]:
        out = []
        for u in self.urls:
            a = (self.start or {}).get(u)
            b = self.end.get(u)
            if a is None or b is None:
                continue
            hits, queries = b.hits - a.hits, b.queries - a.queries
            out.append({"url": u, "source": b.source, "hit_tokens": hits, "query_tokens": queries,
                        "hit_rate": hits / queries if queries > 0 else None})
        return out


class Chain:
    """Two runner hooks around the same request (e.g. vLLM's histogram deltas and this watch)."""

    def __init__(self, *hooks: Any) -> None:
        self.hooks = [h for h in hooks if h is not None]

    def before(self) -> list[Any]:
        return [h.before() for h in self.hooks]

    def after(self, token: list[Any], sample: Any) -> None:
        for h, t in zip(self.hooks, token, strict=True):
            h.after(t, sample)

"""`--scrape`: the servers' /metrics read at a fixed interval while latency-split runs, as time series
(issue 39 item 3), through the one scraper (zgtool.latency.attribution.scrape) and the one vocabulary
(zgtool.latency.attribution.series).

One daemon thread reads every source once per tick (ticks on a fixed schedule from the start; a tick missed
because scrapes ran long is skipped, not queued). Each scrape is bounded in time (the interval, at most the
scraper's 2 s) and bytes; a failed or slow one is counted and reported, never fatal. Memory is bounded: a
source keeps at most `max_points` points; when full, every other point is dropped and from then on one tick
in two is kept (the stride doubles), so a long run keeps its whole span at a coarser step. The summary (min,
max, mean, last) is over every scrape, kept or not.

    loop = ScrapeLoop(["http://127.0.0.1:8000/metrics"], interval_s=1.0, t0_ns=perf_counter_ns()).start()
    ...                                   # the run
    loop.stop(); data = loop.result()     # -> the result JSON's server_metrics
"""

from __future__ import annotations

import ssl
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from zgtool.latency.attribution import series as names
from zgtool.latency.attribution.scrape import MAX_BYTES, TIMEOUT_S, Limits, Scraper

MAX_POINTS = 1024


@dataclass
class _Stat:
    lo: float = float("inf")
    hi: float = float("-inf")
    total: float = 0.0
    n: int = 0
    last: float = 0.0

    def add(self, v: float) -> None:
        self.lo, self.hi, self.total, self.n, self.last = min(self.lo, v), max(self.hi, v), self.total + v, self.n + 1, v

    def public(self) -> dict[str, float]:
        return {"min": self.lo, "max": self.hi, "mean": self.total / self.n, "last": self.last, "n": self.n}


@dataclass
class Source:
    """One /metrics over the run: its kept points and its counts."""

    url: str
    max_points: int = MAX_POINTS
    engine: str | None = None
    t_s: list[float] = field(default_factory=list)
    values: dict[str, list[float | None]] = field(default_factory=dict)
    stride: int = 1                  # ticks per kept point
    ticks: int = 0
    scrapes: int = 0
    failed: int = 0
    first_error: str | None = None
    slow: int = 0                    # scrapes that took longer than the interval
    slowest_s: float = 0.0
    largest_bytes: int = 0
    stats: dict[str, _Stat] = field(default_factory=dict)
    last: names.Reading | None = None

    def add(self, t_s: float, point: dict[str, float]) -> None:
        for k, v in point.items():
            self.stats.setdefault(k, _Stat()).add(v)
        self.ticks += 1
        if (self.ticks - 1) % self.stride:
            return
        if len(self.t_s) >= self.max_points:          # full: keep every other point, halve the rate
            self.t_s = self.t_s[::2]
            self.values = {k: v[::2] for k, v in self.values.items()}
            self.stride *= 2
            if (self.ticks - 1) % self.stride:
                return
        n = len(self.t_s)
        self.t_s.append(round(t_s, 3))
        for k in point.keys() - self.values.keys():
            self.values[k] = [None] * n
        for k, vals in self.values.items():
            vals.append(point.get(k))

    def public(self, interval_s: float) -> dict[str, Any]:
        series = {k: [None if v is None else round(v, 6) for v in vals] for k, vals in self.values.items()
                  if any(v is not None for v in vals)}
        return {"url": self.url, "engine": self.engine, "interval_s": interval_s, "stride": self.stride,
                "t_s": self.t_s, "series": series, "units": {k: names.UNITS[k] for k in series},
                "summary": {k: s.public() for k, s in self.stats.items()},
                "scrapes": self.scrapes, "failed": self.failed, "first_error": self.first_error,
                "slow": self.slow, "slowest_s": round(self.slowest_s, 4), "largest_bytes": self.largest_bytes}


class ScrapeLoop:
    """Reads every URL once per `interval_s` on one thread until stop(); result() is the server_metrics list."""

    def __init__(self, urls: list[str], *, interval_s: float = 1.0, t0_ns: int, ctx: ssl.SSLContext | None = None,
                 max_points: int = MAX_POINTS, max_bytes: int = MAX_BYTES) -> None:
        self.interval_s = interval_s
        self.t0_s = t0_ns / 1e9
        limits = Limits(timeout_s=min(TIMEOUT_S, interval_s), max_bytes=max_bytes)
        self.sources = [Source(u, max_points) for u in dict.fromkeys(urls)]
        self.scrapers = [Scraper(s.url, limits, ctx) for s in self.sources]
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="zgtool-scrape", daemon=True)

    def start(self) -> ScrapeLoop:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=TIMEOUT_S * len(self.sources) + 1.0)

    def _run(self) -> None:
        start = time.perf_counter()
        tick = 0
        while not self._stop.is_set():
            self.scrape_once()
            tick = max(tick + 1, int((time.perf_counter() - start) / self.interval_s) + 1)   # skip missed ticks
            self._stop.wait(max(0.0, start + tick * self.interval_s - time.perf_counter()))
        self.scrape_once()          # the state at the run's end

    def scrape_once(self) -> None:
        for src, scraper in zip(self.sources, self.scrapers, strict=True):
            s = scraper.scrape()
            src.scrapes += 1
            src.slowest_s = max(src.slowest_s, s.elapsed_s)
            if s.elapsed_s > self.interval_s:
                src.slow += 1
            if not s.ok:
                src.failed += 1
                src.first_error = src.first_error or s.error
                continue
            src.largest_bytes = max(src.largest_bytes, s.size_bytes)
            reading = names.read(s, src.engine)
            src.engine = src.engine or reading.engine
            point = dict(reading.levels)
            if src.last is not None:
                point.update({k: v for k, v in names.rates(src.last, reading).items() if k not in point})
            src.last = reading
            src.add(s.t_s - s.elapsed_s / 2 - self.t0_s, point)

    def result(self) -> list[dict[str, Any]]:
        return [s.public(self.interval_s) for s in self.sources]

    def warnings(self) -> list[str]:
        """One line per source that failed, ran slow, or carried none of the known series."""
        return warnings(self.result())


def warnings(server_metrics: list[dict[str, Any]]) -> list[str]:
    out = []
    for src in server_metrics:
        url, n = src["url"], src["scrapes"]
        if src["failed"]:
            out.append(f"--scrape {url}: {src['failed']} of {n} scrapes failed (first: {src['first_error']}); "
                       "the run went on")
        if src["slow"]:
            out.append(f"--scrape {url}: {src['slow']} of {n} scrapes took longer than the {src['interval_s']:g} s "
                       f"interval (slowest {src['slowest_s']:.2f} s): those ticks were skipped")
        if src["failed"] < n and src["engine"] is None:
            out.append(f"--scrape {url}: answered, but with none of the known engine or gateway metrics")
    return out

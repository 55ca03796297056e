"""One Prometheus scraper for every reader of an engine's /metrics: the per-request histogram deltas of the
attribution fallback (promdelta.py), and a `--scrape` time series (issue 39) alike.

A scrape is bounded in time and in bytes: a /metrics that answers slowly or endlessly ends the scrape with
`error` set ("timed out after 2.0 s", "over 8388608 bytes") and the run goes on; it never raises for the
network or the body. Parsing is the text exposition format (version 0.0.4, what vLLM, SGLang, TGI and zgtool
serve expose): a sample line `name{labels} value [timestamp]`, `# TYPE`/`# HELP` lines kept per family.

    scraper = Scraper("http://127.0.0.1:8000/metrics")
    s = scraper.scrape()                  # Scrape(url, t_s, elapsed_s, samples, types, error)
    s.value("vllm:num_requests_running")  # summed over label sets; None when absent
    s.histogram("vllm:e2e_request_latency_seconds")   # (sum, count) or None
"""

from __future__ import annotations

import math
import ssl
import time
import urllib.request
from dataclasses import dataclass, field

TIMEOUT_S = 2.0
MAX_BYTES = 8 << 20
READ_BYTES = 64 << 10


@dataclass(frozen=True)
class Limits:
    timeout_s: float = TIMEOUT_S      # the whole scrape: connect, headers and body
    max_bytes: int = MAX_BYTES        # a body over this is cut and the scrape reported as failed


@dataclass(frozen=True)
class Sample:
    name: str
    labels: tuple[tuple[str, str], ...]
    value: float


@dataclass(frozen=True)
class Scrape:
    """One reading of one /metrics: when (perf_counter seconds, at the answer's end), how long it took, and
    its samples; `error` says why there are none (the run continues either way)."""

    url: str
    t_s: float
    elapsed_s: float
    samples: tuple[Sample, ...] = ()
    types: dict[str, str] = field(default_factory=dict)     # family -> counter | gauge | histogram | ...
    error: str | None = None
    size_bytes: int = 0                                      # the body's length

    @property
    def ok(self) -> bool:
        return self.error is None

    def value(self, name: str, **labels: str) -> float | None:
        """The sum of `name` over the label sets that carry `labels`; None when no such sample."""
        want = set(labels.items())
        vals = [s.value for s in self.samples if s.name == name and want <= set(s.labels)]
        return sum(vals) if vals else None

    def histogram(self, family: str) -> tuple[float, float] | None:
        """(sum, count) of a histogram family over all label sets; (0, 0) when declared but never observed."""
        total, count = self.value(family + "_sum"), self.value(family + "_count")
        if total is None or count is None:
            return (0.0, 0.0) if family in self.types else None
        return total, count


def parse(text: str) -> tuple[tuple[Sample, ...], dict[str, str]]:
    """Samples and declared types of a text exposition; malformed lines are skipped, never fatal."""
    samples: list[Sample] = []
    types: dict[str, str] = {}
    for line in text.splitlines():
        line = line.strip()
        if not line:
            continue
        if line[0] == "#":
            parts = line.split(None, 3)
            if len(parts) >= 4 and parts[1] == "TYPE":
                types[parts[2]] = parts[3].strip()
            continue
        sample = _sample(line)
        if sample is not None:
            samples.append(sample)
    return tuple(samples), types


def _sample(line: str) -> Sample | None:
    brace = line.find("{")
    space = line.find(" ")
    if brace >= 0 and (space < 0 or brace < space):
        end = line.rfind("}")
        if end < brace:
            return None
        name, labels, rest = line[:brace], _labels(line[brace + 1:end]), line[end + 1:]
    else:
        if space < 0:
            return None
        name, labels, rest = line[:space], (), line[space:]
    parts = rest.split()
    if not name or not parts:
        return None
    try:
        value = float(parts[0])
    except ValueError:
        return None
    return Sample(name, labels, value) if not math.isnan(value) else None


def _labels(text: str) -> tuple[tuple[str, str], ...]:
    out: list[tuple[str, str]] = []
    i, n = 0, len(text)
    while i < n:
        eq = text.find("=", i)
        if eq < 0:
            break
        key = text[i:eq].strip().lstrip(",").strip()
        j = text.find('"', eq)
        if j < 0:
            break
        k, val = j + 1, []
        while k < n and text[k] != '"':
            if text[k] == "\\" and k + 1 < n:
                val.append({"n": "\n"}.get(text[k + 1], text[k + 1]))
                k += 2
                continue
            val.append(text[k])
            k += 1
        out.append((key, "".join(val)))
        i = k + 1
    return tuple(out)


class Scraper:
    """Reads one /metrics URL, bounded by `limits`; build once, call scrape() as often as needed."""

    def __init__(self, url: str, limits: Limits | None = None, ctx: ssl.SSLContext | None = None) -> None:
        self.url = url
        self.limits = limits or Limits()
        self.ctx = ctx

    def scrape(self) -> Scrape:
        t0 = time.perf_counter()
        deadline = t0 + self.limits.timeout_s
        try:
            body = self._read(deadline)
        except _Bounded as exc:
            return self._failed(t0, str(exc))
        except (OSError, ValueError) as exc:        # refused, reset, HTTP error, bad URL
            return self._failed(t0, f"unreachable ({exc.__class__.__name__}: {exc})"[:200])
        samples, types = parse(body.decode("utf-8", "replace"))
        t1 = time.perf_counter()
        return Scrape(self.url, t1, t1 - t0, samples, types, size_bytes=len(body))

    def _failed(self, t0: float, why: str) -> Scrape:
        t1 = time.perf_counter()
        return Scrape(self.url, t1, t1 - t0, error=why)

    def _read(self, deadline: float) -> bytes:
        left = deadline - time.perf_counter()
        with urllib.request.urlopen(self.url, timeout=max(left, 0.001), context=self.ctx) as resp:  # noqa: S310
            chunks: list[bytes] = []
            size = 0
            while True:
                left = deadline - time.perf_counter()
                if left <= 0:
                    raise _Bounded(f"timed out after {self.limits.timeout_s:g} s")
                sock = getattr(getattr(getattr(resp, "fp", None), "raw", None), "_sock", None)
                if sock is not None:
                    sock.settimeout(left)         # each read waits no longer than the scrape has left
                try:
                    chunk = resp.read1(READ_BYTES) if hasattr(resp, "read1") else resp.read(READ_BYTES)
                except TimeoutError:
                    raise _Bounded(f"timed out after {self.limits.timeout_s:g} s") from None
                if not chunk:
                    return b"".join(chunks)
                size += len(chunk)
                if size > self.limits.max_bytes:
                    raise _Bounded(f"over {self.limits.max_bytes} bytes")
                chunks.append(chunk)


class _Bounded(Exception):
    """A scrape cut by its limits."""

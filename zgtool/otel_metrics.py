"""`--otlp-endpoint URL`: the OpenTelemetry GenAI client metrics of a run, pushed over OTLP/HTTP (protobuf).

Metric names, units, attributes and bucket boundaries follow the GenAI semantic conventions
(semantic-conventions v1.41 docs/gen-ai/gen-ai-metrics.md): `gen_ai.client.operation.duration`,
`.time_to_first_chunk`, `.time_per_output_chunk` (s) and `gen_ai.client.token.usage` ({token}).
Every point also carries `zgtool.path` (the target's name: direct, a gateway kind, a zgtool.toml name),
so the paths of one run stay apart in the backend. One cumulative export at the end of the run; the
protobuf is written by the small encoder below (no opentelemetry-sdk dependency); the tests decode it
with the official opentelemetry-proto classes.
"""

from __future__ import annotations

import bisect
import struct
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from zgtool.errors import UsageError

METRICS_PATH = "/v1/metrics"
# ExplicitBucketBoundaries the conventions recommend
DURATION_BUCKETS_S = (0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92)
TOKEN_BUCKETS = (1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304, 16777216, 67108864)
DURATION = "gen_ai.client.operation.duration"
TTFC = "gen_ai.client.operation.time_to_first_chunk"
TPOC = "gen_ai.client.operation.time_per_output_chunk"
TOKENS = "gen_ai.client.token.usage"
PATH_ATTR = "zgtool.path"
CUMULATIVE = 2  # opentelemetry.proto.metrics.v1.AggregationTemporality
_SPECS = {  # name -> (unit, description, bounds)
    DURATION: ("s", "GenAI operation duration.", DURATION_BUCKETS_S),
    TTFC: ("s", "Time to receive the first chunk, from issuing the request.", DURATION_BUCKETS_S),
    TPOC: ("s", "Time per output chunk, for each chunk after the first.", DURATION_BUCKETS_S),
    TOKENS: ("{token}", "Number of input and output tokens used.", TOKEN_BUCKETS),
}
PROVIDERS = {"anthropic": "anthropic", "openai": "openai"}  # zgtool --api -> gen_ai.provider.name

Attrs = tuple[tuple[str, str | int], ...]


@dataclass
class Histogram:
    """One data point of an explicit-bucket histogram (bucket i counts bounds[i-1] < v <= bounds[i])."""

    bounds: tuple[float, ...]
    counts: list[int] = field(default_factory=list)
    count: int = 0
    sum: float = 0.0
    min: float = float("inf")
    max: float = float("-inf")

    def __post_init__(self) -> None:
        self.counts = [0] * (len(self.bounds) + 1)

    def record(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.count += 1
        self.sum += value
        self.min = min(self.min, value)
        self.max = max(self.max, value)


class Recorder:
    """Histograms per metric per attribute set; `encode()` is the ExportMetricsServiceRequest."""

    def __init__(self) -> None:
        self.points: dict[str, dict[Attrs, Histogram]] = {name: {} for name in _SPECS}
        self.start_ns = time.time_ns()

    def record(self, name: str, attrs: dict[str, str | int], value: float) -> None:
        key = tuple(sorted(attrs.items()))
        per = self.points[name]
        if key not in per:
            per[key] = Histogram(_SPECS[name][2])
        per[key].record(value)

    def record_sample(self, sample: Any, base: dict[str, str | int], stream: bool) -> None:
        """One latency-split RequestSample: its duration always (error.type when it failed); chunk timing
        and token usage when it succeeded and reported them."""
        if sample.total_ms is not None:
            attrs = dict(base)
            if not sample.ok:
                attrs["error.type"] = sample.error or (str(sample.status) if sample.status else "_OTHER")
            self.record(DURATION, attrs, sample.total_ms / 1000.0)
        if not sample.ok:
            return
        if stream and sample.ttft_ms is not None:
            self.record(TTFC, base, sample.ttft_ms / 1000.0)
        if stream:
            for gap_ms in sample.itl_ms:
                self.record(TPOC, base, gap_ms / 1000.0)
        for kind, n in (("input", sample.input_tokens), ("output", sample.output_tokens)):
            if n is not None:
                self.record(TOKENS, {**base, "gen_ai.token.type": kind}, float(n))

    def encode(self, service: str = "zgtool") -> bytes:
        from zgtool import __version__

        now = time.time_ns()
        metrics = b"".join(_metric(name, per, self.start_ns, now) for name, per in self.points.items() if per)
        scope = _ld(1, _string(1, "zgtool") + _string(2, __version__)) + metrics
        resource = _ld(1, _kv("service.name", service))
        return _ld(1, _ld(1, resource) + _ld(2, scope))


def base_attrs(target: Any) -> dict[str, str | int]:
    """The attributes every point of one target carries (server.* are the address the client called)."""
    return {"gen_ai.operation.name": "chat", "gen_ai.provider.name": PROVIDERS.get(target.api, target.api),
            "gen_ai.request.model": target.model, "server.address": target.host, "server.port": target.port,
            PATH_ATTR: target.name}


def metrics_url(endpoint: str) -> str:
    """A collector's base URL gets /v1/metrics (as OTEL_EXPORTER_OTLP_ENDPOINT does); a URL with a path
    is used as it is (as OTEL_EXPORTER_OTLP_METRICS_ENDPOINT)."""
    parts = urlsplit(endpoint)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise UsageError(f"--otlp-endpoint {endpoint!r}: expected an http(s) URL like http://127.0.0.1:4318")
    try:
        parts.port  # noqa: B018 - raises on a bad port
    except ValueError:
        raise UsageError(f"--otlp-endpoint {endpoint!r}: bad port") from None
    path = parts.path if parts.path not in ("", "/") else METRICS_PATH
    return urlunsplit((parts.scheme, parts.netloc, path, parts.query, ""))


class GenAiMetrics:
    """Records a run's samples and pushes them once; an export that fails is reported, not fatal
    (the measurement itself stands)."""

    def __init__(self, url: str, verify: bool | str = True, timeout_s: float = 10.0) -> None:
        self.url = url
        self.verify = verify
        self.timeout_s = timeout_s
        self.recorder = Recorder()

    @classmethod
    def for_endpoint(cls, endpoint: str, verify: bool | str = True) -> GenAiMetrics:
        return cls(metrics_url(endpoint), verify=verify)

    def add_split(self, targets: Sequence[Any], samples: Sequence[Iterable[Any]], stream: bool) -> None:
        for target, per_target in zip(targets, samples, strict=True):
            base = base_attrs(target)
            for s in per_target:
                self.recorder.record_sample(s, base, stream)

    def push(self) -> str | None:
        """POST the export; None when the collector took it, else one line saying why not."""
        import httpx

        body = self.recorder.encode()
        try:
            r = httpx.post(self.url, content=body, headers={"Content-Type": "application/x-protobuf"},
                           timeout=self.timeout_s, verify=self.verify)
        except httpx.HTTPError as exc:
            return f"OTLP export to {self.url} failed: {exc}"
        if r.status_code // 100 != 2:
            return f"OTLP export to {self.url} answered HTTP {r.status_code}: {r.text[:200].strip()}"
        return None

    def export_split(self, targets: Sequence[Any], samples: Sequence[Iterable[Any]], *, stream: bool,
                     err: Any) -> None:
        self.add_split(targets, samples, stream)
        problem = self.push()
        if problem:
            err.print(problem, style="yellow", highlight=False)
        else:
            n = sum(h.count for h in self.recorder.points[DURATION].values())
            err.print(f"[dim]exported the GenAI client metrics of {n} requests to {self.url}[/dim]",
                      highlight=False)


# -- protobuf wire format (https://protobuf.dev/programming-guides/encoding/), just what the export needs --

def _varint(n: int) -> bytes:
    n &= (1 << 64) - 1
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def _tag(field_no: int, wire: int) -> bytes:
    return _varint(field_no << 3 | wire)


def _ld(field_no: int, payload: bytes) -> bytes:
    return _tag(field_no, 2) + _varint(len(payload)) + payload


def _string(field_no: int, text: str) -> bytes:
    return _ld(field_no, text.encode())


def _fixed64(field_no: int, n: int) -> bytes:
    return _tag(field_no, 1) + struct.pack("<Q", n)


def _double(field_no: int, x: float) -> bytes:
    return _tag(field_no, 1) + struct.pack("<d", x)


def _kv(key: str, value: str | int) -> bytes:
    # common.v1.KeyValue{key=1, value=2: AnyValue{string_value=1, int_value=3}}
    any_value = _varint(3 << 3) + _varint(value) if isinstance(value, int) else _string(1, value)
    return _string(1, key) + _ld(2, any_value)


def _data_point(attrs: Attrs, h: Histogram, start_ns: int, now_ns: int) -> bytes:
    # metrics.v1.HistogramDataPoint
    out = b"".join(_ld(9, _kv(k, v)) for k, v in attrs)
    out += _fixed64(2, start_ns) + _fixed64(3, now_ns) + _fixed64(4, h.count) + _double(5, h.sum)
    out += _ld(6, struct.pack(f"<{len(h.counts)}Q", *h.counts))
    out += _ld(7, struct.pack(f"<{len(h.bounds)}d", *h.bounds))
    if h.count:
        out += _double(11, h.min) + _double(12, h.max)
    return out


def _metric(name: str, per: dict[Attrs, Histogram], start_ns: int, now_ns: int) -> bytes:
    unit, description, _ = _SPECS[name]
    points = b"".join(_ld(1, _data_point(a, h, start_ns, now_ns)) for a, h in per.items())
    histogram = points + _tag(2, 0) + _varint(CUMULATIVE)
    # metrics.v1.Metric{name=1, description=2, unit=3, histogram=9}
    return _ld(2, _string(1, name) + _string(2, description) + _string(3, unit) + _ld(9, histogram))


def k6_durations(points_file: Any) -> Iterable[tuple[str, float, str | None]]:
    """(path tag, seconds, error.type or None) of every http_req_duration point k6 wrote (--out csv)."""
    import csv
    import gzip
    from urllib.parse import parse_qsl

    with gzip.open(points_file, "rt", newline="") as f:
        for row in csv.DictReader(f):
            if row.get("metric_name") != "http_req_duration":
                continue
            tags = dict(parse_qsl(row.get("extra_tags") or ""))
            path = tags.get("path") or row.get("scenario") or ""
            failed = (row.get("expected_response") or "true") != "true"
            status = row.get("status") or ""
            error = None
            if failed:   # the HTTP status when there was one, else k6's error code (timeouts, refused)
                error = status if status not in ("", "0") else (row.get("error_code") or "_OTHER")
            yield path, float(row["metric_value"]) / 1000.0, error


def export_k6_points(endpoint: str, result: Any, targets: dict[str, Any], *, err: Any) -> None:
    """`bench --otlp-endpoint`: gen_ai.client.operation.duration of every k6 request, per path. k6 sees
    neither the first SSE event nor the token counts, so the chunk and token metrics are not sent."""
    from pathlib import Path

    points = Path(result.config["run_dir"]) / "points.csv.gz"
    exporter = GenAiMetrics.for_endpoint(endpoint)
    try:
        rows = list(k6_durations(points))
    except (OSError, EOFError, ValueError, KeyError) as exc:
        err.print(f"OTLP export skipped: cannot read k6's points {points}: {exc}", style="yellow", highlight=False)
        return
    for path, seconds, error in rows:
        target = targets.get(path)
        if target is None:
            continue
        attrs = base_attrs(target)
        attrs[PATH_ATTR] = target.name if path == "gateway" else path
        if error is not None:
            attrs["error.type"] = error
        exporter.recorder.record(DURATION, attrs, seconds)
    problem = exporter.push()
    if problem:
        err.print(problem, style="yellow", highlight=False)
    else:
        err.print(f"[dim]exported gen_ai.client.operation.duration of {len(rows)} k6 requests to "
                  f"{exporter.url}[/dim]", highlight=False)

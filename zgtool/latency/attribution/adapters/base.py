"""What one response carried (headers, timing fields of the body or of any stream chunk) and the
checks every adapter's reading goes through before it becomes an EngineTiming."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from zgtool.latency.records import EngineTiming

# the body/chunk keys adapters read; the last value seen in the body or any chunk is kept
WATCHED_KEYS = ("metrics", "meta_info", "timings", "total_duration", "load_duration", "prompt_eval_duration",
                "eval_duration", "prompt_eval_count", "eval_count")
# a gateway (LiteLLM) forwards an upstream's headers under this prefix
PROVIDER_PREFIX = "llm_provider-"
# the engine's clock and the client's differ: an engine total this much over the client's is still rounding
CLOCK_TOLERANCE_MS = 1.0
# no engine answers a request in under a microsecond: a converted total below it was sent in another unit
MIN_PLAUSIBLE_TOTAL_MS = 1e-3


@dataclass
class Evidence:
    """Everything an adapter may read about one response. Built by the client while it reads."""

    headers: dict[str, str] = field(default_factory=dict)        # lower-case name -> value(s)
    fields: dict[str, Any] = field(default_factory=dict)         # WATCHED_KEYS -> last value seen
    server_timing: dict[str, float] = field(default_factory=dict)  # zgtool's Server-Timing parts (ms)
    stream: bool = False

    @classmethod
    def from_headers(cls, headers: Iterable[tuple[bytes | str, bytes | str]], *, stream: bool = False) -> Evidence:
        ev = cls(stream=stream)
        for k, v in headers:
            name = (k.decode("latin-1") if isinstance(k, bytes) else k).lower()
            value = v.decode("latin-1") if isinstance(v, bytes) else v
            # a repeated header is one comma-separated list (RFC 9110 5.3): Server-Timing may come twice
            ev.headers[name] = f"{ev.headers[name]}, {value}" if name in ev.headers else value
        return ev

    def note_doc(self, doc: Mapping[str, Any]) -> None:
        """A JSON body or stream chunk: keep the watched keys it has (a later chunk wins)."""
        for key in WATCHED_KEYS:
            if key in doc and doc[key] is not None:
                self.fields[key] = doc[key]

    def header(self, name: str) -> str | None:
        """A header by its lower-case name, or the copy a gateway forwarded under llm_provider-."""
        v = self.headers.get(name)
        return v if v is not None else self.headers.get(PROVIDER_PREFIX + name)


class Reject(Exception):
    """An adapter's reading that cannot be trusted for this request; the message is the counted reason."""


def number(value: Any, name: str) -> float:
    """A JSON or header value -> float, or Reject naming what was wrong with it."""
    if isinstance(value, bool):
        raise Reject(f"{name} not a number")
    if isinstance(value, str):
        try:
            value = float(value.strip())
        except ValueError:
            raise Reject(f"{name} not a number") from None
    if not isinstance(value, int | float) or not math.isfinite(value):
        raise Reject(f"{name} not a number")
    if value < 0:
        raise Reject(f"{name} negative")
    return float(value)


def optional(obj: Mapping[str, Any], key: str, scale_to_ms: float, name: str | None = None) -> float | None:
    """obj[key] converted to ms, None when absent or null."""
    v = obj.get(key)
    return None if v is None else number(v, name or key) * scale_to_ms


def check_against_client(timing: EngineTiming, client_total_ms: float | None, scale_to_ms: float = 1.0) -> None:
    """No engine figure can exceed the request around it. When the raw value would have fit had the unit
    been ms, the field's unit is what is wrong (an implausible magnitude), and the reason says so; so is a
    converted total under a microsecond (ms sent where ns are documented)."""
    if timing.total_ms is not None and scale_to_ms != 1.0 and 0 < timing.total_ms < MIN_PLAUSIBLE_TOTAL_MS:
        raise Reject("total_ms implausible magnitude (unit?)")
    if client_total_ms is None:
        return
    limit = client_total_ms + CLOCK_TOLERANCE_MS
    values = {"queue_ms": timing.queue_ms, "prefill_ms": timing.prefill_ms, "decode_ms": timing.decode_ms,
              "total_ms": timing.total_ms, "ttft_ms": timing.ttft_ms, **timing.other_ms}
    for name, v in values.items():
        if v is None or v <= limit:
            continue
        if scale_to_ms != 1.0 and v / scale_to_ms <= limit:
            raise Reject(f"{name} implausible magnitude (unit?)")
        raise Reject(f"{name} exceeds the client's total")
    parts = sum(v for v in (timing.queue_ms, timing.prefill_ms, timing.decode_ms) if v is not None)
    if parts > limit:
        raise Reject("phases sum past the client's total")

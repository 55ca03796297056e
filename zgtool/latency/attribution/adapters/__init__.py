"""Engine-native timing adapters: one module per engine, one units table (units.py), one entry point.

`read_engine(evidence, client_total_ms)` tries every adapter in ENGINE_ADAPTERS order and returns the first
reading that passes the checks, plus the reasons any reading was ignored ("<source>: <reason>"), which the
result counts per target as attribution_warnings. A reading is never partly used: a missing, negative,
non-numeric or implausible field drops that adapter's whole reading for the request.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from types import ModuleType

from zgtool.latency.attribution.adapters import llamacpp, ollama, openai, servertiming, sglang, tgi, vllm
from zgtool.latency.attribution.adapters.base import Evidence, Reject, check_against_client
from zgtool.latency.attribution.adapters.hops import hop_reports
from zgtool.latency.records import EngineTiming, RequestSample


@dataclass(frozen=True)
class Adapter:
    source: str
    read: Callable[[Evidence], EngineTiming | None]
    scale_to_ms: float


def _adapter(m: ModuleType) -> Adapter:
    return Adapter(m.SOURCE, m.read, m.SCALE_TO_MS)


# most specific first: a per-request split beats a bare total
ENGINE_ADAPTERS: tuple[Adapter, ...] = tuple(_adapter(m) for m in (servertiming, vllm, sglang, tgi, llamacpp, ollama,
                                                                   openai))


def read_engine(ev: Evidence, client_total_ms: float | None,
                adapters: Iterable[Adapter] = ENGINE_ADAPTERS) -> tuple[EngineTiming | None, list[str]]:
    warnings: list[str] = []
    for a in adapters:
        try:
            timing = a.read(ev)
            if timing is None:
                continue
            check_against_client(timing, client_total_ms, a.scale_to_ms)
        except Reject as exc:
            warnings.append(f"{a.source}: {exc}")
            continue
        return timing, warnings
    return None, warnings


def attach(sample: RequestSample, ev: Evidence) -> None:
    """Fill a measured sample's engine timing, warnings and hop self-reports from what arrived."""
    sample.hop_reports = hop_reports(ev)
    if not sample.ok:
        return
    sample.engine, sample.engine_warnings = read_engine(ev, sample.total_ms)


def count_warnings(samples: Iterable[RequestSample]) -> dict[str, int]:
    """attribution_warnings of one target: reason -> number of requests it was ignored on."""
    return dict(Counter(w for s in samples for w in s.engine_warnings))


__all__ = ["ENGINE_ADAPTERS", "Adapter", "Evidence", "attach", "count_warnings", "hop_reports", "read_engine"]

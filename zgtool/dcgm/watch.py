"""The watch loop: sample a source every interval, keep a per-GPU timeline, run the rules.

Measurement only; zgtool.dcgm.render draws it and the command wires both.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from zgtool.dcgm.metrics import UNITS, GpuReading
from zgtool.dcgm.rules import Rule, RuleEvaluator
from zgtool.dcgm.sources import Source
from zgtool.errors import ZgError
from zgtool.stats import summarize


@dataclass(frozen=True)
class WatchConfig:
    interval_s: float = 1.0
    duration_s: float | None = None  # None: until interrupted (or one sample with once)
    once: bool = False
    history_len: int = 60  # samples kept per GPU for the sparklines

    def __post_init__(self) -> None:
        from zgtool.errors import UsageError

        if not self.interval_s > 0:
            raise UsageError(f"--interval must be > 0 seconds, not {self.interval_s}")
        if self.duration_s is not None and self.duration_s < 0:
            raise UsageError(f"--duration must be >= 0 seconds, not {self.duration_s}")


@dataclass
class GpuTimeline:
    key: str
    host: str
    gpu: str
    uuid: str
    model: str
    mig: str
    t_s: list[float] = field(default_factory=list)
    series: dict[str, list[float | None]] = field(default_factory=dict)

    def add(self, t_s: float, metrics: dict[str, float]) -> None:
        n = len(self.t_s)
        for name in metrics.keys() - self.series.keys():
            self.series[name] = [None] * n  # a metric that appears late is None before
        for name, values in self.series.items():
            values.append(metrics.get(name))
        self.t_s.append(t_s)

    def last(self) -> dict[str, float]:
        return {k: v[-1] for k, v in self.series.items() if v and v[-1] is not None}

    def recent(self, name: str, n: int) -> list[float]:
        return [v for v in self.series.get(name, [])[-n:] if v is not None]


@dataclass
class WatchState:
    """Everything the live table and the result need, updated on every tick."""

    source: dict[str, Any]
    config: WatchConfig
    rules: list[Rule]
    evaluator: RuleEvaluator
    gpus: dict[str, GpuTimeline] = field(default_factory=dict)
    ticks: int = 0
    elapsed_s: float = 0.0
    errors: list[dict[str, Any]] = field(default_factory=list)
    stopped_by: str = ""

    def add(self, t_s: float, readings: list[GpuReading]) -> None:
        for r in readings:
            tl = self.gpus.get(r.key)
            if tl is None:
                tl = self.gpus[r.key] = GpuTimeline(r.key, r.host, r.gpu, r.uuid, r.model, r.mig)
            tl.add(t_s, r.metrics)
        self.evaluator.observe(t_s, readings)
        self.ticks += 1
        self.elapsed_s = t_s


def watch(
    source: Source,
    rules: list[Rule],
    config: WatchConfig,
    *,
    on_tick: Callable[[WatchState], None] | None = None,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> WatchState:
    """Sample until duration/once/Ctrl-C. The first read must succeed; later failures are
    recorded as gaps so a flaky exporter does not end a long recording."""
    state = WatchState(source.describe(), config, rules, RuleEvaluator(rules))
    t0 = clock()
    k = 0
    try:
        while True:
            try:
                readings = source.read()
            except ZgError as exc:
                if state.ticks == 0:
                    raise
                state.errors.append({"t_s": round(clock() - t0, 3), "error": exc.message})
                readings = None
            t = clock() - t0
            if readings is not None:
                state.add(t, readings)
            if on_tick is not None:
                on_tick(state)
            if config.once:
                state.stopped_by = "once"
                break
            k += 1
            next_t = k * config.interval_s
            # tolerance: 3 * 0.05 must not count as past a 0.15 s duration
            if config.duration_s is not None and next_t > config.duration_s + 1e-9:
                state.stopped_by = "duration"
                break
            delay = next_t - (clock() - t0)
            if delay > 0:
                sleep(delay)
    except KeyboardInterrupt:
        state.stopped_by = "interrupt"
    return state


def result_data(state: WatchState) -> dict[str, Any]:
    """The "dcgm.watch" result payload: a timeline per GPU, summaries, rules and alerts."""
    gpus = []
    for tl in state.gpus.values():
        gpus.append({
            "key": tl.key, "host": tl.host, "gpu": tl.gpu, "uuid": tl.uuid, "model": tl.model, "mig": tl.mig,
            "t_s": [round(t, 3) for t in tl.t_s],
            "series": tl.series,
            "last": tl.last(),
            "summary": {name: summarize([v for v in vals if v is not None]) for name, vals in tl.series.items()},
        })
    alerts = [_alert_dict(a) for a in state.evaluator.history]
    alerts += [_alert_dict(a) for a in state.evaluator.active() if a.state == "pending"]
    return {
        "source": state.source,
        "interval_s": state.config.interval_s,
        "duration_s": round(state.elapsed_s, 3),
        "samples": state.ticks,
        "stopped_by": state.stopped_by,
        "units": {k: v for k, v in UNITS.items()},
        "gpus": gpus,
        "rules": [r.public() for r in state.rules],
        "alerts": alerts,
        "firing": sorted({a.rule for a in state.evaluator.firing()}),
        "errors": state.errors,
    }


def _alert_dict(a: Any) -> dict[str, Any]:
    return {"rule": a.rule, "gpu": a.key, "state": a.state, "severity": a.severity, "message": a.message,
            "pending_since_s": round(a.pending_since_s, 3),
            "fired_at_s": None if a.fired_at_s is None else round(a.fired_at_s, 3),
            "resolved_at_s": None if a.resolved_at_s is None else round(a.resolved_at_s, 3),
            "peak_value": a.peak_value}

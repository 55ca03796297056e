"""AutoFallbackPolicy: step down to a smaller model under sustained load, back up after a cool-down.

Falling back needs fresh evidence on the current model (N consecutive timeouts while
the last load hint is above the threshold); recovering needs the cool-down to have
passed since the last switch, M consecutive healthy answers and a load below a lower
threshold (hysteresis). A recovery that fails again within its cool-down doubles the
next cool-down, so a primary that stays overloaded is probed ever more rarely.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from zgtool.client.hints import LoadHint

log = logging.getLogger("zgtool.client.policy")

FALLBACK = "fallback"
RECOVER = "recover"


@dataclass(frozen=True)
class FallbackConfig:
    models: tuple[str, ...]                  # ordered: primary first, then fallbacks
    util_threshold_pct: float | None = 95.0  # None: timeouts alone trigger a fallback
    timeouts_to_fallback: int = 3
    recover_below_pct: float = 80.0          # hysteresis: must drop well below the trigger
    recover_successes: int = 3
    cooldown_s: float = 30.0
    max_cooldown_s: float = 600.0
    hint_ttl_s: float = 60.0                 # an older hint says nothing about load now

    def __post_init__(self) -> None:
        if not self.models:
            raise ValueError("models must name at least one model")
        if len(set(self.models)) != len(self.models):
            raise ValueError(f"models must be distinct, got {list(self.models)}")
        if self.util_threshold_pct is not None and not 0 < self.util_threshold_pct <= 100:
            raise ValueError(f"util_threshold_pct must be in (0, 100], not {self.util_threshold_pct}")
        if self.util_threshold_pct is not None and self.recover_below_pct > self.util_threshold_pct:
            raise ValueError("recover_below_pct must not exceed util_threshold_pct (no hysteresis otherwise)")
        if self.timeouts_to_fallback < 1 or self.recover_successes < 1:
            raise ValueError("timeouts_to_fallback and recover_successes must be >= 1")
        if self.cooldown_s < 0 or self.max_cooldown_s < self.cooldown_s:
            raise ValueError("need 0 <= cooldown_s <= max_cooldown_s")


@dataclass(frozen=True)
class Observation:
    """What one attempt taught us about the model it was sent to."""

    model: str
    ok: bool
    timed_out: bool = False
    hint: LoadHint | None = None


@dataclass(frozen=True)
class Switch:
    at_s: float
    from_model: str
    to_model: str
    direction: str  # "fallback" | "recover"
    reason: str


class AutoFallbackPolicy:
    """Thread-safe; share one instance between all requests that should steer together."""

    def __init__(self, config: FallbackConfig | Sequence[str], *, clock: Callable[[], float] = time.monotonic,
                 registry: Any = None) -> None:
        self.config = config if isinstance(config, FallbackConfig) else FallbackConfig(tuple(config))
        self._clock = clock
        self._lock = threading.Lock()
        self._index = 0
        self._timeouts = 0        # consecutive timeouts on the current model since the last switch
        self._healthy = 0         # consecutive healthy answers on the current model since the last switch
        self._hint: LoadHint | None = None
        self._hint_at = 0.0
        self._last_switch: Switch | None = None
        self._cooldown_s = self.config.cooldown_s
        self.switches: list[Switch] = []
        self.switch_counts: Counter[tuple[str, str, str]] = Counter()  # (from, to, direction) -> n
        self._prom = None
        if registry is not None:
            from prometheus_client import Counter as PromCounter

            self._prom = PromCounter("zg_client_model_switches", "Model switches made by AutoFallbackPolicy",
                                     ["from_model", "to_model", "direction"], registry=registry)

    @property
    def model(self) -> str:
        return self.config.models[self._index]

    @property
    def cooldown_s(self) -> float:
        """The cool-down now in force (grows after failed recoveries)."""
        return self._cooldown_s

    def choose(self) -> str:
        """The model for the next attempt (may recover first if the cool-down has passed)."""
        with self._lock:
            self._maybe_recover(self._clock())
            return self.model

    def observe(self, obs: Observation) -> Switch | None:
        """Record one attempt's outcome; returns the switch it caused, if any."""
        with self._lock:
            now = self._clock()
            if obs.hint is not None:
                self._hint, self._hint_at = obs.hint, now
            if obs.model != self.model:
                return None  # a straggler sent before the last switch: not evidence about this model
            if obs.timed_out:
                self._timeouts += 1
                self._healthy = 0
            elif obs.ok:
                self._timeouts = 0
                self._healthy += 1
            else:
                self._timeouts = 0
                self._healthy = 0
            if obs.timed_out:
                return self._maybe_fall_back(now)
            return self._maybe_recover(now)

    # -- internals (lock held) -------------------------------------------------------------

    def _fresh_util(self, now: float) -> float | None:
        if self._hint is None or now - self._hint_at > self.config.hint_ttl_s:
            return None
        return self._hint.util_pct

    def _maybe_fall_back(self, now: float) -> Switch | None:
        cfg = self.config
        if self._index >= len(cfg.models) - 1 or self._timeouts < cfg.timeouts_to_fallback:
            return None
        util = self._fresh_util(now)
        if cfg.util_threshold_pct is not None:
            if util is None or util <= cfg.util_threshold_pct:
                return None
            load = f"load {util:.1f}% > {cfg.util_threshold_pct:g}%"
        else:
            load = "no load threshold set"
        last = self._last_switch
        if last is not None and last.direction == RECOVER and now - last.at_s < self._cooldown_s:
            self._cooldown_s = min(cfg.max_cooldown_s, max(self._cooldown_s, cfg.cooldown_s) * 2)
        else:
            self._cooldown_s = cfg.cooldown_s
        reason = f"{self._timeouts} consecutive timeouts and {load}"
        return self._switch(now, self._index + 1, FALLBACK, reason)

    def _maybe_recover(self, now: float) -> Switch | None:
        cfg = self.config
        if self._index == 0 or self._healthy < cfg.recover_successes:
            return None
        since = now - self._last_switch.at_s if self._last_switch is not None else float("inf")
        if since < self._cooldown_s:
            return None
        util = self._fresh_util(now)
        if util is not None and util >= cfg.recover_below_pct:
            return None
        load = "load unknown" if util is None else f"load {util:.1f}% < {cfg.recover_below_pct:g}%"
        reason = f"cool-down {self._cooldown_s:g} s passed, {self._healthy} healthy answers, {load}"
        return self._switch(now, self._index - 1, RECOVER, reason)

    def _switch(self, now: float, to_index: int, direction: str, reason: str) -> Switch:
        sw = Switch(now, self.model, self.config.models[to_index], direction, reason)
        self._index = to_index
        self._timeouts = 0
        self._healthy = 0
        self._last_switch = sw
        self.switches.append(sw)
        self.switch_counts[(sw.from_model, sw.to_model, direction)] += 1
        if self._prom is not None:
            self._prom.labels(sw.from_model, sw.to_model, direction).inc()
        log.info("model %s: %s -> %s (%s)", direction, sw.from_model, sw.to_model, reason)
        return sw

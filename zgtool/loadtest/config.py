"""Frozen configuration for `zgtool bench` runs, validated on construction."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from zgtool.errors import UsageError

SCENARIOS = ("gateway", "direct", "direct_stream")
APIS = ("anthropic", "openai")
ARRIVALS = ("constant", "poisson")   # evenly spaced starts, or Poisson (k6 scripts: Bernoulli thinning)


def _check_timeout(value: float) -> None:
    if not 0 < value < float("inf"):
        raise UsageError(f"--timeout-s must be a positive number of seconds, not {value:g}")


def _check_arrivals(value: str) -> None:
    if value not in ARRIVALS:
        raise UsageError(f"--arrivals must be one of {', '.join(ARRIVALS)}, not {value!r}")


def parse_duration_s(text: str | float, *, what: str = "--duration") -> float:
    """'10s', '500ms', '2m', '1h' or a bare number of seconds -> seconds."""
    if isinstance(text, int | float):
        seconds = float(text)
    else:
        m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h)?\s*", str(text))
        if not m:
            raise UsageError(f"{what}: expected a duration like 10s, 500ms or 2m, not {text!r}")
        seconds = float(m.group(1)) * {"ms": 0.001, "s": 1, "m": 60, "h": 3600, None: 1}[m.group(2)]
    if seconds <= 0:
        raise UsageError(f"{what} must be positive")
    return seconds


def k6_duration(seconds: float) -> str:
    return f"{int(seconds * 1000)}ms" if seconds < 1 or seconds != int(seconds) else f"{int(seconds)}s"


def parse_rates(text: str) -> tuple[int, ...]:
    try:
        rates = tuple(int(r) for r in text.split(",") if r.strip())
    except ValueError as exc:
        raise UsageError(f"--rates: expected a comma list of whole requests/s like 5,10,20, not {text!r}") from exc
    if not rates or any(r < 1 for r in rates) or list(rates) != sorted(rates):
        raise UsageError(f"--rates: expected increasing positive rates like 5,10,20, not {text!r}")
    return rates


@dataclass(frozen=True)
class BenchConfig:
    rate_rps: int = 10  # per scenario; constant-arrival-rate
    duration_s: float = 10.0  # per scenario
    pre_allocated_vus: int = 10
    max_vus: int = 100
    scenarios: tuple[str, ...] = SCENARIOS
    sequential: bool = True  # scenarios one after another, so they do not share the CPUs
    api: str = "anthropic"
    payload: Path | None = None  # default: k6/payloads/<api>.json
    arrivals: str = "constant"
    request_timeout_s: float = 60.0  # k6's per-request timeout
    # sequential scenarios take turns in this many rounds (k6/gateway_vs_direct.js ROUNDS): drift falls on every
    # path alike and the paths are paired round by round; fewer where a round would be under a second
    rounds: int = 10

    def __post_init__(self) -> None:
        _check_arrivals(self.arrivals)
        _check_timeout(self.request_timeout_s)
        if self.rounds < 1:
            raise UsageError(f"--rounds must be at least 1, not {self.rounds}")
        if self.rate_rps < 1:
            raise UsageError("--rate must be at least 1 request/s")
        if self.duration_s <= 0:
            raise UsageError("--duration must be positive")
        if self.pre_allocated_vus < 1 or self.max_vus < self.pre_allocated_vus:
            raise UsageError("--pre-vus must be >= 1 and --max-vus >= --pre-vus")
        if not self.scenarios:
            raise UsageError(f"--scenarios: choose at least one of {', '.join(SCENARIOS)}")
        unknown = [s for s in self.scenarios if s not in SCENARIOS]
        if unknown:
            raise UsageError(f"--scenarios: unknown {', '.join(unknown)}; choose from {', '.join(SCENARIOS)}")
        if self.api not in APIS:
            raise UsageError(f"--api must be one of {', '.join(APIS)}, not {self.api!r}")
        if self.payload is not None and not Path(self.payload).is_file():
            raise UsageError(f"--payload file not found: {self.payload}")

    @property
    def turns(self) -> int:
        """The rounds k6 runs: 1 for scenarios at once, and no round shorter than a second."""
        return max(1, min(self.rounds, int(self.duration_s))) if self.sequential else 1

    @property
    def expected_s(self) -> float:
        """Wall time k6 needs (the script leaves 1 s between sequential scenarios, 0.25 s between turns)."""
        n = len(self.scenarios) if self.sequential else 1
        slots = n * self.turns
        return n * self.duration_s + (slots - 1) * (0.25 if self.turns > 1 else 1.0)


@dataclass(frozen=True)
class RampConfig:
    rates: tuple[int, ...] = (5, 10, 20, 40, 80)
    step_s: float = 5.0
    warmup_s: float = 2.0  # at the first rate, not measured: first connections, lazy imports
    pre_allocated_vus: int = 10
    max_vus: int = 200
    api: str = "anthropic"
    stream: bool = False
    knee_factor: float = 2.0
    arrivals: str = "constant"
    ttft_at_knee_s: float = 0.0  # > 0: measure streaming TTFT with zgtool's client at the knee for this long
    request_timeout_s: float = 60.0  # k6's per-request timeout
    payload: Path | None = None  # default: k6/payloads/<api>.json (a copy with the detected model for bare URLs)

    def __post_init__(self) -> None:
        _check_arrivals(self.arrivals)
        _check_timeout(self.request_timeout_s)
        if self.ttft_at_knee_s < 0:
            raise UsageError("--ttft-at-knee must be >= 0 seconds")
        if not self.rates or any(r < 1 for r in self.rates):
            raise UsageError("--rates must be positive requests/s")
        if self.step_s <= 0:
            raise UsageError("--step must be positive")
        if self.warmup_s < 0:
            raise UsageError("--warmup must be >= 0")
        if self.api not in APIS:
            raise UsageError(f"--api must be one of {', '.join(APIS)}, not {self.api!r}")
        if self.knee_factor <= 1:
            raise UsageError("the knee factor must be > 1")
        if self.payload is not None and not Path(self.payload).is_file():
            raise UsageError(f"--payload file not found: {self.payload}")

    def expected_s(self, num_paths: int) -> float:
        return num_paths * (self.warmup_s + self.step_s * len(self.rates)) + (num_paths - 1) * 1.0

"""When each request of an open-loop block is due: send offsets in seconds from the block's start.

The dispatcher (zgtool.latency.schedule.openloop) takes any such sequence, so a trace's own timestamps
(trace replay) ride the same path as a generated Poisson or constant schedule.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

ARRIVALS = ("poisson", "constant")


def arrival_offsets_s(n: int, rate_rps: float, arrivals: str = "poisson", seed: int = 0) -> tuple[float, ...]:
    """`n` send offsets at `rate_rps`, the first at 0.

    constant: evenly spaced 1/rate apart. poisson: exponential gaps of mean 1/rate (a Poisson
    process, vLLM's --request-rate with burstiness 1), reproducible from `seed`."""
    if n < 0:
        raise ValueError(f"n must not be negative, not {n}")
    if not rate_rps > 0:
        raise ValueError(f"the rate must be positive, not {rate_rps}")
    if arrivals not in ARRIVALS:
        raise ValueError(f"arrivals must be one of {', '.join(ARRIVALS)}, not {arrivals!r}")
    if n == 0:
        return ()
    if arrivals == "constant":
        return tuple(i / rate_rps for i in range(n))
    rng = random.Random(seed)
    out = [0.0]
    for _ in range(n - 1):
        out.append(out[-1] + rng.expovariate(rate_rps))
    return tuple(out)


def check_schedule(offsets: Sequence[float]) -> str | None:
    """Why `offsets` is not a usable schedule (negative, not a number, out of order), or None."""
    prev = 0.0
    for i, t in enumerate(offsets):
        if not isinstance(t, int | float) or t != t or t in (float("inf"), float("-inf")):
            return f"offset {i} is not a finite number ({t!r})"
        if t < 0:
            return f"offset {i} is negative ({t})"
        if t < prev:
            return f"offset {i} ({t}) is earlier than the one before it ({prev})"
        prev = float(t)
    return None


def block_schedule(offsets: Sequence[float]) -> tuple[float, ...]:
    """A slice of a whole-run schedule rebased so the block's first request is due at its start."""
    if not offsets:
        return ()
    first = offsets[0]
    return tuple(t - first for t in offsets)


def parse_rate(text: str) -> float:
    """One --rate value: a positive number of requests per second (per target). Raises UsageError."""
    from zgtool.errors import UsageError

    try:
        rate = float(text.strip().removesuffix("rps").removesuffix("/s"))
    except ValueError:
        raise UsageError(f"--rate must be a number of requests per second, not {text!r}") from None
    if not (0 < rate < float("inf")):
        raise UsageError(f"--rate must be a positive number of requests per second, not {text!r}")
    return rate

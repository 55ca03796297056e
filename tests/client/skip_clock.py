"""A monotonic clock a test can move forward: a cool-down passes without sleeping through it,
and "still inside the cool-down" holds however slowly a loaded machine runs the test."""

from __future__ import annotations

import time


class SkipClock:
    def __init__(self) -> None:
        self.skipped_s = 0.0

    def __call__(self) -> float:
        return time.monotonic() + self.skipped_s

    def skip(self, seconds: float) -> None:
        self.skipped_s += seconds

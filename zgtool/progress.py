"""A live progress line on stderr: requests done/total, req/s, errors, elapsed, rewritten in place.

Shown only when the stream is a terminal and the run is not --quiet, and only once the run has lasted
`after_s` (a run of a second never flickers a line). Counting is thread-safe (the latency client's -c
workers call `add` at once); drawing is throttled to one write per `interval_s`.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable
from typing import Any, TextIO

AFTER_ENV = "ZGTOOL_PROGRESS_AFTER_S"   # tests set 0 so a short run shows its line
DEFAULT_AFTER_S = 2.0
CLEAR_EOL = "\x1b[K"


def wanted(stream: TextIO, quiet: bool) -> bool:
    """The line is drawn only on a terminal, and never with --quiet."""
    if quiet:
        return False
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty())


def _after_s() -> float:
    try:
        return max(0.0, float(os.environ.get(AFTER_ENV, DEFAULT_AFTER_S)))
    except ValueError:
        return DEFAULT_AFTER_S


def line(label: str, done: int, total: int | None, errors: int, elapsed_s: float) -> str:
    """'label  37/100 requests  12.3 req/s  0 errors  3.1s' (pure, so the format is tested alone)."""
    rate = done / elapsed_s if elapsed_s > 0 else 0.0
    of = f"/{total}" if total else ""
    return f"{label}  {done}{of} requests  {rate:.1f} req/s  {errors} error{'s' if errors != 1 else ''}  " \
           f"{elapsed_s:.1f}s"


class ProgressLine:
    """Counts finished requests and redraws one line; `close()` leaves the terminal on a fresh line."""

    def __init__(self, label: str, total: int | None, *, stream: TextIO | None = None, quiet: bool = False,
                 interval_s: float = 0.2, after_s: float | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = wanted(self.stream, quiet)
        self.label = label
        self.total = total
        self.done = 0
        self.errors = 0
        self._interval_s = interval_s
        self._after_s = _after_s() if after_s is None else after_s
        self._clock = clock
        self._t0 = clock()
        self._last_draw = float("-inf")
        self._drawn = False
        self._lock = threading.Lock()

    def add(self, ok: bool = True, n: int = 1) -> None:
        with self._lock:
            self.done += n
            if not ok:
                self.errors += n
            if self.enabled:
                self._maybe_draw(final=False)

    def advance_to(self, done: int) -> None:
        """Catch up to a count known only per block (the open-loop dispatcher reports blocks, not requests)."""
        with self._lock:
            if done > self.done:
                self.done = done
                if self.enabled:
                    self._maybe_draw(final=False)

    def clear(self) -> None:
        """Blank the line (before other output on the same stream); the next count draws it again."""
        with self._lock:
            if self.enabled and self._drawn:
                self.stream.write("\r" + CLEAR_EOL)
                self.stream.flush()
                self._last_draw = float("-inf")

    def set_label(self, label: str) -> None:
        with self._lock:
            self.label = label

    def _maybe_draw(self, final: bool) -> None:
        now = self._clock()
        elapsed = now - self._t0
        if not final and (elapsed < self._after_s or now - self._last_draw < self._interval_s):
            return
        self._last_draw = now
        self._drawn = True
        self.stream.write("\r" + line(self.label, self.done, self.total, self.errors, elapsed) + CLEAR_EOL)
        self.stream.flush()

    def close(self) -> None:
        """Draw the last count (if the line was ever shown) and end it, so later output starts clean."""
        with self._lock:
            if self.enabled and self._drawn:
                self._maybe_draw(final=True)
                self.stream.write("\n")
                self.stream.flush()
            self.enabled = False

    def __enter__(self) -> ProgressLine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class CountingHook:
    """A latency runner hook (before/after each request) that counts on a ProgressLine, around an
    optional inner hook: the open-loop dispatcher reports requests through hooks only."""

    def __init__(self, bar: ProgressLine, inner: Any = None) -> None:
        self.bar = bar
        self.inner = inner

    def before(self) -> Any:
        return self.inner.before() if self.inner is not None else None

    def after(self, token: Any, sample: Any) -> None:
        if self.inner is not None:
            self.inner.after(token, sample)
        self.bar.add(bool(sample.ok))

    def unmeasured(self, send: Any) -> Any:
        return self.inner.unmeasured(send) if self.inner is not None else send()    # warm-ups are not counted

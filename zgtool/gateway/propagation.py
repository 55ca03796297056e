"""Trace-context propagation through a hop, judged from what reached the engine.

A client sends a W3C ``traceparent`` (``00-<trace id>-<span id>-<flags>``); the engine records the
trace id and parent span id it received (``x-zgtool-trace-id`` / ``x-zgtool-parent-span-id``
response headers, access-log ``trace_id`` / ``parent_span_id``). The verdict:

    preserved   the same trace id reached the engine: "pass-through" (the client's span is the
                engine's parent) or "hop as parent" (the hop inserted a span of its own)
    split       a different trace id reached the engine: the hop started a new trace, so the
                client's trace and the engine's span can no longer be joined by trace id
    dropped     no valid traceparent reached the engine
"""

from __future__ import annotations

import re
import secrets
from dataclasses import dataclass

VERDICTS = ("preserved", "split", "dropped")
_TRACEPARENT = re.compile(r"00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})")


@dataclass(frozen=True)
class TraceParent:
    trace_id: str   # 32 lowercase hex
    span_id: str    # 16 lowercase hex
    flags: int = 1

    def header(self) -> str:
        return f"00-{self.trace_id}-{self.span_id}-{self.flags:02x}"

    @classmethod
    def fresh(cls) -> TraceParent:
        return cls(secrets.token_hex(16), secrets.token_hex(8), 1)

    @classmethod
    def parse(cls, value: str) -> TraceParent | None:
        m = _TRACEPARENT.fullmatch(value.strip())
        if m is None or m.group(1) == "0" * 32 or m.group(2) == "0" * 16:
            return None
        return cls(m.group(1), m.group(2), int(m.group(3), 16))


@dataclass(frozen=True)
class Propagation:
    verdict: str            # one of VERDICTS
    how: str                # "pass-through", "hop as parent", "same trace (parent unknown)",
                            # "new trace" or "nothing arrived"
    reached_trace_id: str | None = None
    reached_parent_span_id: str | None = None

    def __post_init__(self) -> None:
        if self.verdict not in VERDICTS:
            raise ValueError(f"verdict must be one of {', '.join(VERDICTS)}, not {self.verdict!r}")


def propagation_verdict(sent: TraceParent, reached_trace_id: str | None,
                        reached_parent_span_id: str | None = None) -> Propagation:
    """What a hop did to `sent`, given the trace id (and parent span id) the engine received
    (None: none arrived)."""
    trace = (reached_trace_id or "").strip().lower() or None
    parent = (reached_parent_span_id or "").strip().lower() or None
    if trace is None:
        return Propagation("dropped", "nothing arrived")
    if trace != sent.trace_id:
        return Propagation("split", "new trace", trace, parent)
    if parent is None:
        return Propagation("preserved", "same trace (parent unknown)", trace, parent)
    how = "pass-through" if parent == sent.span_id else "hop as parent"
    return Propagation("preserved", how, trace, parent)

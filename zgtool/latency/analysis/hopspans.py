"""A gateway's own account of where it spent each request, from its OTLP spans (zgtool.latency.attribution.otlp's
``hop_account``: LiteLLM's server span and its call to the engine), summarised per path beside the tax measured
from outside.

Per path: how many answered requests had the gateway's call span, and the median of each part: before its call
to the engine (receipt, auth, routing, pre-call hooks), the call (to the last byte of the engine's answer), after
it (to the end of its server span, which may close after the client has the answer's last byte: its logging); and, on the requests whose engine span came too, the median of the call minus the engine's own time
(vLLM's e2e runs from its API server's arrival): the gateway's client, its handling of the answer (a stream's
every chunk: the call ends with the stream) and the network between them. The spans
are the gateway's word (its clock, its idea of a phase), so they are reported beside the measured figures, never
in place of them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from zgtool.latency.records import RequestSample
from zgtool.stats import percentile
from zgtool.targets import Target

PARTS = ("before_call_ms", "call_ms", "after_call_ms")
SOURCE = "LiteLLM OTLP spans"


def hop_account(samples: Sequence[RequestSample]) -> dict[str, Any] | None:
    """The path's summary, or None when no request had the gateway's spans."""
    ok = [s for s in samples if s.ok]
    with_spans = [s for s in ok if s.hop_spans]
    if not with_spans:
        return None
    out: dict[str, Any] = {"source": SOURCE, "requests": len(with_spans), "of": len(ok)}
    for part in PARTS:
        values = [s.hop_spans[part] for s in with_spans if s.hop_spans and part in s.hop_spans]
        if values:
            out[f"p50_{part}"] = percentile(values, 50)
    beyond = [s.hop_spans["call_ms"] - s.engine.total_ms for s in with_spans
              if s.hop_spans and s.engine is not None and s.engine.total_ms is not None]
    if beyond:
        out["p50_call_beyond_engine_ms"] = percentile(beyond, 50)
        out["engine_spans"] = len(beyond)
    return out


def hop_account_notes(targets: Sequence[Target], accounts: Sequence[dict[str, Any] | None]) -> list[str]:
    """One line per path the gateway's spans came for."""
    notes = []
    for t, acc in zip(targets, accounts, strict=True):
        if acc is None:
            continue
        parts = []
        if "p50_before_call_ms" in acc:
            parts.append(f"{acc['p50_before_call_ms']:.2f} ms before its call to the engine")
        call = f"its call {acc['p50_call_ms']:.2f} ms"
        if "p50_call_beyond_engine_ms" in acc:
            call += (f" ({acc['p50_call_beyond_engine_ms']:.2f} ms of it beyond the engine's own time: its client, "
                     f"its handling of the answer (each chunk, in a stream) and the network; on the "
                     f"{acc['engine_spans']} with the engine's span)")
        parts.append(call)
        if "p50_after_call_ms" in acc:
            parts.append(f"{acc['p50_after_call_ms']:.2f} ms after it (to its server span's end, which may come "
                         "after the answer's last byte: its logging)")
        notes.append(f"{t.name}: the gateway's own account ({acc['source']}, {acc['requests']} of {acc['of']} "
                     f"requests; medians, its clock): " + ", ".join(parts))
    return notes

"""One plain line per target with the field's figures beside the latency split (req/s, tok/s,
tokens, goodput, CPU per request), and the attribution notes; the renderer prints them as given."""

from __future__ import annotations

import re

from zgtool.latency.records import SplitResult

# the note older latency_split results carry for a significantly negative outside-engine difference
# (they dropped the figure itself; newer ones keep it and say 'within noise'
# themselves): the report and this printout call it noise, not missing attribution
CHANCE_NEGATIVE = re.compile(r"^(?P<cand>.+?): time outside the engine came out (?P<abs>[\d.]+) ms below "
                             r"(?P<base>.+?)'s? .*?\(95% CI (?P<lo>[+-][\d.]+)\.\.(?P<hi>[+-][\d.]+) ms\)")


def note_text(note: str) -> str:
    """An attribution note as a reader should take it: a chance negative is a difference within noise."""
    m = CHANCE_NEGATIVE.match(note)
    if m is None:
        return note
    return (f"{m['cand']}: time outside the engine came out {m['abs']} ms below {m['base']}'s "
            f"([{m['lo']}, {m['hi']}] ms): a difference within noise (chance, or per-connection effects), "
            "not a saving")


def field_lines(res: SplitResult, short: dict[str, str] | None = None) -> list[str]:
    out = []
    for tr in res.targets:
        tp = tr.throughput
        if tp is None:
            continue
        name = (short or {}).get(tr.name, tr.name)
        parts = [f"{tp.request_rps:.2f} req/s" if tp.request_rps is not None else "– req/s"]
        if tp.output_tok_s is not None:
            parts.append(f"{tp.output_tok_s:.1f} out tok/s")
        if tp.input_tokens is not None or tp.output_tokens is not None:
            parts.append(f"tokens in/out {tp.input_tokens if tp.input_tokens is not None else '–'}/"
                         f"{tp.output_tokens if tp.output_tokens is not None else '–'}")
        if tp.slo is not None and tp.goodput_rps is not None:
            parts.append(f"goodput {tp.goodput_rps:.2f} req/s ({tp.good_requests}/{tp.requests_ok} meet SLO)")
        if tr.cpu_ms_per_request:
            parts.append("CPU ms/req " + ", ".join(f"{k} {v:.2f}" for k, v in tr.cpu_ms_per_request.items()))
        out.append(f"  {name}: " + "; ".join(parts) + f" over {tp.duration_s:.2f} s")
    slo = next((tr.throughput.slo for tr in res.targets if tr.throughput and tr.throughput.slo), None)
    if slo:
        out.append("  goodput: requests/s meeting every SLO (" +
                   ", ".join(f"{k} <= {v:g}" for k, v in slo.items()) + ")")
    out.extend(f"  {note_text(note)}" for note in res.attribution_notes)
    return out

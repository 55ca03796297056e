"""One plain line per target with the field's figures beside the latency split (req/s, tok/s,
tokens, goodput, CPU per request), and the attribution notes; the renderer prints them as given."""

from __future__ import annotations

from zgtool.latency.model import SplitResult


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
    out.extend(f"  {note}" for note in res.attribution_notes)
    return out

"""Incremental detokenization (held back while a UTF-8 sequence is incomplete), stop strings."""

from __future__ import annotations

from zgtool.engine.sequence import Sequence
from zgtool.engine.tokenizer import Tokenizer


def detokenize_step(tok: Tokenizer, seq: Sequence) -> str:
    """Append the text of the newest output token(s) to seq.output_text; return the new text."""
    ids = seq.output_token_ids
    prefix_text = tok.decode(ids[seq.prefix_offset:seq.read_offset])
    new_text = tok.decode(ids[seq.prefix_offset:])
    if len(new_text) > len(prefix_text) and not new_text.endswith("\ufffd"):
        delta = new_text[len(prefix_text):]
        seq.prefix_offset = seq.read_offset
        seq.read_offset = len(ids)
        seq.output_text += delta
        return delta
    return ""


def find_stop(seq: Sequence, delta_len: int) -> str | None:
    """If a stop string completed, truncate output_text before it and return it."""
    stops = seq.params.stop
    if not stops or delta_len == 0:
        return None
    longest = max(len(s) for s in stops)
    start = max(0, len(seq.output_text) - delta_len - longest + 1)
    best: tuple[int, str] | None = None
    for s in stops:
        i = seq.output_text.find(s, start)
        if i != -1 and (best is None or i < best[0]):
            best = (i, s)
    if best is None:
        return None
    seq.output_text = seq.output_text[: best[0]]
    return best[1]


def emittable(seq: Sequence, finished: bool, safe_limit: int | None = None) -> str:
    """Text not yet handed out; while running, hold back what could start a stop string.
    `safe_limit` (the safety filter's cleared length) caps it too: text a stop may end, so the
    filter can never see its continuation, is never handed out before it is cleared."""
    hold = 0 if finished or not seq.params.stop else max(len(s) for s in seq.params.stop) - 1
    end = len(seq.output_text) - hold
    if safe_limit is not None:
        end = min(end, safe_limit)
    end = max(seq.emitted_chars, end)
    text = seq.output_text[seq.emitted_chars:end]
    seq.emitted_chars = end
    return text

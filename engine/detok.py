"""Incremental detokenization (held back while a UTF-8 sequence is incomplete), stop strings."""

from __future__ import annotations

from zgtool.engine.sequence import Sequence
from zgtool.engine.tokenizer import Tokenizer

ONE_TEXT_MAX = 1 << 18     # detokenize_step's memo holds at most this many ids (a vocabulary's worth)
TWO_TEXT_MAX = 1 << 16     # and at most this many pairs


def detokenize_step(tok: Tokenizer, seq: Sequence, one_text: dict[int, str] | None = None,
                    two_text: dict[tuple[int, int], str] | None = None) -> str:
    """Append the text of the newest output token(s) to seq.output_text; return the new text.

    ``one_text``: a memo of decode([id]) for this tokenizer (decode is a pure function of the
    ids). After every token that completed text the prefix window is that one token, so its
    text is looked up instead of decoded: one decode per token instead of two. ``two_text``
    (with ``one_text``): a memo of such a step's outcome, the new text of the window [prefix id,
    new id] ("" while a character is incomplete), a function of the pair alone: a pair seen
    before is decoded not at all."""
    ids = seq.token_ids     # the offsets count output tokens: slice past the prompt, no copy of the output
    p = len(seq.prompt_token_ids)
    start, read = p + seq.prefix_offset, p + seq.read_offset
    if read == start:
        prefix_text = ""    # decode([])
    elif read - start == 1 and one_text is not None:
        tid = ids[start]
        if two_text is not None and len(ids) == read + 1:   # the steady window: [prefix id, new id]
            pair = (tid, ids[read])
            delta = two_text.get(pair)
            if delta is None:
                delta = _delta(_one(tok, tid, one_text), tok.decode(ids[start:]))
                if len(two_text) < TWO_TEXT_MAX:
                    two_text[pair] = delta
            if delta:
                seq.prefix_offset = seq.read_offset
                seq.read_offset = len(ids) - p
                seq.output_text += delta
            return delta
        prefix_text = _one(tok, tid, one_text)
    else:
        prefix_text = tok.decode(ids[start:read])
    delta = _delta(prefix_text, tok.decode(ids[start:]))
    if delta:
        seq.prefix_offset = seq.read_offset
        seq.read_offset = len(ids) - p
        seq.output_text += delta
    return delta


def _one(tok: Tokenizer, tid: int, one_text: dict[int, str]) -> str:
    """decode([tid]) through the memo."""
    text = one_text.get(tid)
    if text is None:
        text = tok.decode([tid])
        if len(one_text) < ONE_TEXT_MAX:
            one_text[tid] = text
    return text


def _delta(prefix_text: str, new_text: str) -> str:
    """What the window's text adds past the prefix's, once it ends in a complete character ("" until then)."""
    if len(new_text) > len(prefix_text) and not new_text.endswith("\ufffd"):
        return new_text[len(prefix_text):]
    return ""


def find_stop(seq: Sequence, delta_len: int) -> str | None:
    """If a stop string completed in the newest `delta_len` characters, truncate output_text before
    it and return it. Only the window where such a match can lie is searched (the new text and
    the longest stop's length before it): O(stops x (delta + longest stop)) per token, whatever
    the text's length. The stop that completes first wins (ties: the one starting first), so the
    cut never depends on how the text was split into tokens."""
    stops = seq.params.stop
    if not stops or delta_len == 0:
        return None
    text = seq.output_text
    longest = max(len(s) for s in stops)
    start = max(0, len(text) - delta_len - longest + 1)
    best: tuple[int, int, str] | None = None
    for s in stops:
        i = text.find(s, start)
        if i != -1 and (best is None or (i + len(s), i) < best[:2]):
            best = (i + len(s), i, s)
    if best is None:
        return None
    seq.output_text = text[: best[1]]
    return best[2]


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

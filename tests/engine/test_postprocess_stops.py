"""Stop strings are matched over the new text only (a window of the longest stop), yet cut exactly
where a search of the whole text would: generated texts, stops and token splits."""

from __future__ import annotations

from hypothesis import example, given, settings
from hypothesis import strategies as st

from zgtool.engine.config import SamplingParams
from zgtool.engine.detok import emittable, find_stop
from zgtool.engine.sequence import Sequence

alphabet = st.sampled_from("abc")


def _whole_text_cut(text: str, stops: tuple[str, ...]) -> tuple[str, str] | None:
    """Reference: after each character, the earliest occurrence of any stop in everything so far."""
    for end in range(1, len(text) + 1):
        hits = [(i, s) for s in stops if (i := text[:end].find(s)) != -1]
        if hits:
            i, s = min(hits)
            return text[:i], s
    return None


@settings(max_examples=300, deadline=None)
@example(text="abc", stops=["abc", "b"], cuts=[3])     # "b" completes first: cut "a", as char by char
@example(text="ab", stops=["ab", "a"], cuts=[2])       # same start: the one that completes first
@example(text="xab", stops=["b", "ab"], cuts=[3])      # same end: the one starting first hides more
@given(text=st.text(alphabet, max_size=40), stops=st.lists(st.text(alphabet, min_size=1, max_size=5),
                                                           min_size=1, max_size=4, unique=True),
       cuts=st.lists(st.integers(1, 6), max_size=40))
def test_the_incremental_match_cuts_where_a_char_by_char_search_does_whatever_the_split(text, stops, cuts):
    seq = Sequence("r", [1], SamplingParams(stop=tuple(stops)))
    pos, found, released = 0, None, ""
    sizes = iter(cuts)
    while pos < len(text) and found is None:
        delta = text[pos:pos + next(sizes, 1)]
        pos += len(delta)
        seq.output_text += delta
        found = find_stop(seq, len(delta))
        released += emittable(seq, found is not None)
    ref = _whole_text_cut(text[:pos], tuple(stops))
    if ref is None:
        assert found is None and seq.output_text == text[:pos]
    else:
        assert found is not None and (seq.output_text, found) == ref
        assert released == ref[0], "text held back while it could start a stop, nothing past the cut"
        assert not any(s in released for s in stops)

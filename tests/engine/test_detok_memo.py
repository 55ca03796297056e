"""Incremental detokenization with the one-token memo (postprocess's ``one_text``) hands out exactly
what decoding both windows every token hands out: the same deltas, offsets and text, token by
token, on the byte tokenizer and on real `tokenizers` models (byte-level BPE, as SmolLM2's, and a
SentencePiece-style Metaspace one whose decoder strips a leading space), across split UTF-8."""

from __future__ import annotations

import functools
import random
import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from zgtool.engine.config import SamplingParams
from zgtool.engine.detok import detokenize_step
from zgtool.engine.sequence import Sequence
from zgtool.engine.tokenizer import ByteTokenizer, HFTokenizer

CORPUS_CHARS = "abc dé日本🙂\n"


@functools.cache
def _hf(kind: str) -> HFTokenizer:
    rng = random.Random(3)
    corpus = ["".join(rng.choice(CORPUS_CHARS) for _ in range(80)) for _ in range(200)]
    if kind == "bytelevel":
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        alphabet = pre_tokenizers.ByteLevel.alphabet()
    else:   # SentencePiece-like: '▁' for spaces, a decoder that strips the text's leading space
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.Metaspace()
        tok.decoder = decoders.Metaspace()
        alphabet = []
    tok.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=300, show_progress=False,
                                                        initial_alphabet=alphabet))
    with tempfile.TemporaryDirectory(prefix="zg-detok-") as scratch:    # read once, at construction
        d = Path(scratch)
        tok.save(str(d / "tokenizer.json"))
        return HFTokenizer(d, (0,), None)


def _run(tok, prompt: list[int], output: list[int], memo: dict[int, str] | None,
         pairs: dict[tuple[int, int], str] | None = None) -> list[tuple]:
    seq = Sequence("r", list(prompt), SamplingParams(max_tokens=len(output) + 1))
    trace = []
    for t in output:
        seq.token_ids.append(t)
        delta = detokenize_step(tok, seq, memo, pairs)
        trace.append((delta, seq.prefix_offset, seq.read_offset, seq.output_text))
    return trace


TOKENIZERS = {"byte": lambda: ByteTokenizer(300), "bytelevel": lambda: _hf("bytelevel"),
              "metaspace": lambda: _hf("metaspace")}
SHARED_MEMO: dict[str, dict[int, str]] = {name: {} for name in TOKENIZERS}
SHARED_PAIRS: dict[str, dict[tuple[int, int], str]] = {name: {} for name in TOKENIZERS}


@pytest.mark.parametrize("name", sorted(TOKENIZERS))
@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_the_memo_never_changes_a_delta(name: str, data: st.DataObject) -> None:
    tok = TOKENIZERS[name]()
    vocab = tok.vocab_size
    prompt = data.draw(st.lists(st.integers(0, vocab - 1), min_size=1, max_size=4))
    if name == "byte":      # bytes of split multi-byte characters, and the synthetic syllables
        output = data.draw(st.lists(st.sampled_from([0x61, 0x20, 0xC3, 0xA9, 0xE6, 0x97, 0xA5, 0xF0, 0x9F,
                                                      0x99, 0x82, 299, 262]), max_size=24))
    else:
        output = data.draw(st.lists(st.integers(0, vocab - 1), max_size=24))
    # the memo outlives a sequence (one per engine): shared across examples, as in serving
    assert _run(tok, prompt, output, SHARED_MEMO[name]) == _run(tok, prompt, output, None)
    # with the pair memo too (postprocess passes both)
    assert _run(tok, prompt, output, SHARED_MEMO[name], SHARED_PAIRS[name]) == _run(tok, prompt, output, None)


def test_a_steady_stream_decodes_once_per_token() -> None:
    """After the first token, each ASCII token costs one decode (the prefix window is memoised)."""
    tok = ByteTokenizer()
    calls = []
    decode = tok.decode
    tok.decode = lambda ids: calls.append(len(ids)) or decode(ids)  # type: ignore[method-assign]
    memo: dict[int, str] = {}
    _run(tok, [1, 2], list(b"hello world, hello"), memo)
    assert len(calls) <= len(b"hello world, hello") + len(set(b"hello world, hello"))
    calls.clear()
    _run(tok, [1, 2], list(b"hello world, hello"), memo)   # every id's text known now
    assert len(calls) == len(b"hello world, hello")


def test_a_steady_stream_of_known_pairs_decodes_nothing() -> None:
    """With the pair memo, a token whose (previous, new) pair was seen costs no decode at all,
    and the deltas are those of the memo-less path."""
    tok = ByteTokenizer()
    calls = []
    decode = tok.decode
    tok.decode = lambda ids: calls.append(len(ids)) or decode(ids)  # type: ignore[method-assign]
    text = list(b"hello world, hello")
    memo: dict[int, str] = {}
    pairs: dict[tuple[int, int], str] = {}
    first = _run(tok, [1, 2], text, memo, pairs)
    calls.clear()
    assert _run(tok, [1, 2], text, memo, pairs) == first == _run(ByteTokenizer(), [1, 2], text, None)
    assert calls == [1]     # the first token only: its window is the one token, not a pair

"""Postprocess runs most tokens (no output filter, no stop strings, not EOS) inline instead of through
``_token``: token by token, the inline steps hand out exactly what ``_token`` hands out (the same
deltas, token ids, finish and final text), on the byte tokenizer and a byte-level BPE, across split
UTF-8 and the max_tokens cut."""

from __future__ import annotations

import functools
import random
import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from zgtool.engine.block_manager import BlockManager
from zgtool.engine.config import SamplingParams
from zgtool.engine.postprocess import Postprocessor
from zgtool.engine.scheduler import ScheduledBatch
from zgtool.engine.sequence import Sequence
from zgtool.engine.tokenizer import ByteTokenizer, HFTokenizer

EOS = 299


@functools.cache
def _bytelevel() -> HFTokenizer:
    """A byte-level BPE (as SmolLM2's) trained on text with multi-byte characters."""
    rng = random.Random(5)
    corpus = ["".join(rng.choice("abc dé日本🙂\n") for _ in range(80)) for _ in range(200)]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=300, show_progress=False,
                                                        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    with tempfile.TemporaryDirectory(prefix="zg-postprocess-") as scratch:    # read once, at construction
        d = Path(scratch)
        tok.save(str(d / "tokenizer.json"))
        return HFTokenizer(d, (EOS,), None)


def _run(tok: Any, prompt: list[int], output: list[int], max_tokens: int, through_token: bool) -> list[tuple]:
    finished: list[str] = []
    pp = Postprocessor(tok, [EOS], BlockManager(4, 4096, enable_prefix_caching=False),
                       lambda seq, reason: finished.append(reason), lambda seqs: [])
    # a filter that clears everything sends every token through _token (the reference)
    flt = (lambda text: None) if through_token else None
    seq = Sequence("r", list(prompt), SamplingParams(max_tokens=max_tokens), flt)
    seq.num_computed_tokens = len(prompt) - 1
    trace = []
    for t in output:
        batch = ScheduledBatch([seq], [1])
        outs = pp(batch, [t], 1.0)
        trace += [(o.token_ids, o.text, o.finished, o.finish_reason, o.stop_sequence, o.error) for o in outs]
        if finished:
            break
    return [*trace, (seq.output_text, seq.token_ids, tuple(finished), len(seq.timings.token_times_s))]


@pytest.mark.parametrize("name", ["byte", "bytelevel"])
@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_the_inline_token_steps_hand_out_what_token_hands_out(name: str, data: st.DataObject) -> None:
    tok = ByteTokenizer(300) if name == "byte" else _bytelevel()
    vocab = tok.vocab_size
    prompt = data.draw(st.lists(st.integers(0, vocab - 2), min_size=1, max_size=4))
    if name == "byte":
        output = data.draw(st.lists(st.sampled_from([0x61, 0x20, 0xC3, 0xA9, 0xE6, 0x97, 0xA5, 0xF0, 0x9F, 0x99,
                                                     0x82, 262, EOS]), max_size=24))
    else:
        output = data.draw(st.lists(st.integers(0, vocab - 1), max_size=24))
    max_tokens = data.draw(st.integers(1, 30))
    assert _run(tok, prompt, output, max_tokens, False) == _run(tok, prompt, output, max_tokens, True)

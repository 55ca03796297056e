"""Deterministic filler text measured in approximate tokens, without a tokenizer.

One word per token: the words below are short, common English words, each one token (with its
leading space) in SmolLM2's BPE vocabulary (1000 words: 1002 tokens), as in GPT-2/Llama-style
vocabularies, so N words are ~N prompt tokens (+ the chat template; zgtool's dummy:* byte-ish
tokenizer makes more). A text's length in tokens, where a count is needed from text (ShareGPT's reference answers),
is estimated as ceil(chars / 4), OpenAI's rule of thumb for English.

The same seed always gives the same words (random.Random with a str seed hashes it with SHA-512, so
PYTHONHASHSEED does not matter): that is what makes repeated Mooncake hash_ids identical prefix blocks.
"""

from __future__ import annotations

import math
import random

WORDS = tuple("""
the of and to in is that for it as was with be by on not he this are or his from at which but have an
they you were her she there been one all we their has would when if more no out so said what up its
about into than them can only other new some could time these two may then do first any my now such
like our over man me even most made after also did many before must through back years where much your
way well down should because each just those people how too little state good very make world still
own see men work long get here between both life being under never day same another know while last
might us great old year off come since against go came right used take three states himself few house
use during without again place around however home small found thought went say part once general high
upon school every does got united left number course war until always away something fact though water
less public put think almost hand enough far took head yet government system better set told nothing
night end why called didn find going look asked later point knew city next program business give group
toward young days let room president side social given present several order national possible rather
second face per among form important often things looked early white case john become large big need
four within felt along children saw best church ever least power development light thing seemed family
interest want members mind country area others done turned although open god service certain kind problem
began different door thus help sense means whole matter perhaps itself table times law human line above
name example action company hands local show whether five history gave today either act feet across
""".split())


def words(n: int, seed: str) -> list[str]:
    """n words drawn with a generator seeded by `seed` (same seed, same words)."""
    rng = random.Random(seed)
    return rng.choices(WORDS, k=max(0, n))


def text(n: int, seed: str) -> str:
    """~n tokens of filler text (one word per token), the same for the same seed."""
    return " ".join(words(n, seed))


def approx_tokens(s: str) -> int:
    """Tokens of a text without a tokenizer: ceil(chars / 4), at least 1 for a non-empty text."""
    return max(1, math.ceil(len(s) / 4)) if s else 0

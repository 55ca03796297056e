"""The null backend: real bookkeeping (scheduler, KV blocks, prefix cache, detokenization), zero compute.

It measures pure serving overhead, so it needs no tensors: nothing here (nor what the engine builds
around it) imports torch, and `zgtool serve --model null` starts without loading it: ready in 0.55 s
with 52 MB resident, where loading torch took it to 2.0-2.4 s and 247 MB (2-core Xeon).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from zgtool.engine.tokenizer import ByteTokenizer

if TYPE_CHECKING:
    from zgtool.engine.scheduler import ScheduledBatch

NULL_MODEL = "null"
NULL_VOCAB = 512


def null_tokenizer() -> ByteTokenizer:
    return ByteTokenizer(NULL_VOCAB)


def null_device(requested: str) -> str | None:
    """Where the null backend says it runs: it computes nothing, so ``auto`` is the host, never a GPU it
    would only probe (and load torch for); None for a CUDA device asked for by name, which the engine
    checks as it checks any model's (its GPU figures then go into the load hint)."""
    if requested == "auto":
        return "cpu"
    return None if requested.startswith("cuda") else requested


class NullRunner:
    """Zero compute: emits a fixed text, byte by byte. Measures pure serving overhead."""

    TEXT = b"Hello from the zgtool null model. "

    def execute(self, batch: ScheduledBatch) -> list[int | None]:
        text, size = self.TEXT, len(self.TEXT)
        out: list[int | None] = []
        for seq, n in zip(batch.seqs, batch.num_new_tokens, strict=True):
            num_tokens = len(seq.token_ids)     # needs_sample and num_output_tokens, inlined
            out.append(text[(num_tokens - len(seq.prompt_token_ids)) % size]
                       if seq.num_computed_tokens + n == num_tokens else None)
        return out

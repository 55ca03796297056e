"""The model runner (issue 34 moved it out of engine/runner.py): a ScheduledBatch into tensors, the
forward, sampling. handback.py and cuda_runner.py build on it and engine/runner.py's make_runner picks
among them: they import this module, not runner.py, so none of them is in an import circle with it."""

from __future__ import annotations

import torch

from zgtool.engine.errors import SequenceFault
from zgtool.engine.model import AttnMeta, LlamaModel, build_attn_meta
from zgtool.engine.sampling import sample
from zgtool.engine.scheduler import ScheduledBatch
from zgtool.engine.sequence import Sequence


def needs_sample(seq: Sequence, n: int) -> bool:
    return seq.num_computed_tokens + n == seq.num_tokens


class ModelRunner:
    def __init__(self, model: LlamaModel, block_size: int) -> None:
        self.model = model
        self.block_size = block_size
        self.device = model.device

    def prepare(self, batch: ScheduledBatch) -> tuple[torch.Tensor, AttnMeta, list[int]]:
        bs = self.block_size
        ids: list[int] = []
        pos: list[int] = []
        slots: list[int] = []
        dec_idx: list[int] = []
        dec_tables: list[list[int]] = []
        dec_lens: list[int] = []
        prefills: list[tuple[int, int, list[int], int]] = []
        logit_rows: list[int] = []
        for seq, n in zip(batch.seqs, batch.num_new_tokens, strict=True):
            start = seq.num_computed_tokens
            s = len(ids)
            ids.extend(seq.token_ids[start:start + n])
            table = seq.block_table
            for p in range(start, start + n):
                pos.append(p)
                slots.append(table[p // bs] * bs + p % bs)
            if n == 1 and start > 0:
                dec_idx.append(s)
                dec_tables.append(list(table))
                dec_lens.append(start + 1)
            else:
                prefills.append((s, s + n, table, start))
            if needs_sample(seq, n):
                logit_rows.append(len(ids) - 1)
        dev = self.device
        meta = build_attn_meta(pos, slots, dec_idx, dec_tables, dec_lens, prefills, bs, dev)
        return torch.tensor(ids, dtype=torch.long, device=dev), meta, logit_rows

    def _fault(self, rows: list[int], input_ids: torch.Tensor, meta: AttnMeta) -> SequenceFault:
        """Non-finite logits for these batch rows: the step is run again layer by layer to name where
        the first non-finite value appears (the message reaches the log and the failed requests)."""
        where = self.model.nonfinite_layer(input_ids, meta)
        at = ("in the embedding" if where == -1 else "after the last layer (final norm or lm_head)"
              if where is None else f"in layer {where}")
        return SequenceFault(rows, f"non-finite logits {at}")

    @torch.inference_mode()
    def execute(self, batch: ScheduledBatch) -> list[int | None]:
        input_ids, meta, logit_rows = self.prepare(batch)
        hidden = self.model.forward(input_ids, meta)
        sampled: list[int | None] = [None] * len(batch.seqs)
        if not logit_rows:
            return sampled
        if len(logit_rows) != hidden.shape[0]:  # a steady decode samples every row: no gather
            hidden = hidden[torch.tensor(logit_rows, device=self.device)]
        if len(logit_rows) == len(batch.seqs):  # every sequence samples (a steady decode)
            which: range | list[int] = range(len(batch.seqs))
        else:
            which = [i for i, (seq, n) in enumerate(zip(batch.seqs, batch.num_new_tokens, strict=True))
                     if needs_sample(seq, n)]
        if all(batch.seqs[i].params.greedy for i in which):
            toks = self.model.greedy_tokens(hidden)  # the lm_head and argmax in one C call
            if toks is not None:
                bad = self.model.nonfinite_greedy_rows(len(toks))
                if bad:
                    raise self._fault([list(which)[r] for r in bad], input_ids, meta)
                for i, tok in zip(which, toks, strict=True):
                    sampled[i] = tok
                return sampled
        logits = self.model.logits(hidden)
        params = [batch.seqs[i].params for i in which]
        gens = [batch.seqs[i].generator for i in which]  # type: ignore[misc]
        try:
            tokens = sample(logits, params, gens, self.model.nonfinite_rows)  # type: ignore[arg-type]
        except SequenceFault as fault:  # rows of `which` -> rows of the batch
            rows = [list(which)[r] for r in fault.rows]
            if fault.message != "non-finite logits":
                raise SequenceFault(rows, fault.message) from None
            raise self._fault(rows, input_ids, meta) from None
        for i, tok in zip(which, tokens, strict=True):
            sampled[i] = tok
        return sampled

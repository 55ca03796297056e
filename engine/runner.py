"""Model runners: turn a ScheduledBatch into tensors, run the forward, sample.

All tensors live here; the scheduler and block manager never see one."""

from __future__ import annotations

from typing import Protocol

import torch

from zgtool.engine.config import EngineConfig
from zgtool.engine.errors import SequenceFault
from zgtool.engine.model import AttnMeta, LlamaModel, build_attn_meta
from zgtool.engine.sampling import sample
from zgtool.engine.scheduler import ScheduledBatch
from zgtool.engine.sequence import Sequence


class Runner(Protocol):
    def execute(self, batch: ScheduledBatch) -> list[int | None]: ...


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


def weights_oom(model: str, device: str) -> Exception:
    """Out of device memory for the weights at start-up: one line for the CLI (exit 4)."""
    from zgtool.engine.errors import ModelUnavailable

    return ModelUnavailable(f"out of {device.split(':')[0].upper()} memory loading the weights of {model!r}: the "
                            "model does not fit this device (the KV pool comes after it: --kv-memory-mb sizes that)")


def make_runner(model: LlamaModel, cfg: EngineConfig, num_blocks: int, max_model_len: int) -> ModelRunner:
    """The runner for the model's device, chosen once at start-up, after the KV pool is allocated:
    on CUDA engine/cuda_runner.py (static buffers, device sampling, graphs unless cfg.cuda_graphs is
    off, one spare pad block past num_blocks), elsewhere the step thread's hand-back runner. Out of
    device memory for the pool: ModelUnavailable naming the budget and --kv-memory-mb (CLI exit 4)."""
    from zgtool.engine.handback import HandbackRunner

    on_cuda = model.device.type == "cuda"
    blocks = num_blocks + (1 if on_cuda else 0)
    try:
        model.allocate_kv(blocks, cfg.block_size)
    except torch.OutOfMemoryError:
        from zgtool.engine.errors import ModelUnavailable

        model.k_cache, model.v_cache = [], []
        mib = blocks * model.kv_bytes_per_block(cfg.block_size) / 2**20
        source = "--kv-memory-mb" if cfg.kv_memory_bytes is not None else f"{cfg.kv_memory_fraction:g} of free memory"
        raise ModelUnavailable(f"out of {model.device.type.upper()} memory allocating the KV pool: a budget of "
                               f"{mib:.0f} MiB ({blocks} blocks, {source}) does not fit beside the weights; "
                               "give a smaller --kv-memory-mb") from None
    if not on_cuda:
        return HandbackRunner(model, cfg.block_size)
    from zgtool.engine.cuda_runner import CudaRunner

    return CudaRunner(model, cfg.block_size, cfg.max_num_seqs, max_model_len, pad_block=num_blocks,
                      cuda_graphs=cfg.cuda_graphs)


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

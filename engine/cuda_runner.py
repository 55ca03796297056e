"""The GPU step (issue 35): a decode step with no host work inside it, replayed from CUDA graphs.

A decode-only step (every sequence adds one token) writes its metadata -- input ids, positions,
KV slots, context lengths, block tables and the sampling parameters -- into one pinned host
buffer and copies it to the device in ONE host-to-device copy, into static device buffers at fixed
addresses. The forward, the lm_head and the sampling (engine/device_sampling.py) read only those
buffers, and the sampled ids come back in ONE device-to-host copy: nothing else synchronises.

With graphs on, one CUDA graph per batch-size bucket (1, 2, 4, ..., the running cap) is captured
at start-up; a decode step of B sequences replays the smallest bucket >= B with the rows past B
padded (each pad row writes its KV into a spare block no sequence owns and attends to that one
position). Steps with prompt chunks (prefill, mixed) run eagerly (engine/model_runner.py's metadata,
flash SDPA per chunk), sampling still on the device. A capture that fails leaves graphs off with
the reason in `graph_status` (banner, /metrics); the engine never fails for it.

The logic that needs no CUDA -- buckets, buffer filling, the eager fallback decision, device
sampling -- runs on CPU too (device 'cpu', graphs off): tests/engine/test_cuda_runner.py.
"""

from __future__ import annotations

import logging
from typing import cast

import numpy as np
import torch

from zgtool.engine.attention import AttnMeta
from zgtool.engine.device_sampling import NONFINITE, sample_on_device
from zgtool.engine.handback import HandbackRunner
from zgtool.engine.model import LlamaModel
from zgtool.engine.model_runner import needs_sample
from zgtool.engine.scheduler import ScheduledBatch
from zgtool.engine.sequence import Sequence

log = logging.getLogger("zgtool.engine")

SPARE_BLOCKS = 1  # the pad rows' block, after the block manager's blocks


def graph_buckets(cap: int) -> tuple[int, ...]:
    """1, 2, 4, ... below cap, then cap itself: the batch sizes a graph is captured for."""
    out, b = [], 1
    while b < cap:
        out.append(b)
        b *= 2
    return (*out, cap)


def bucket_for(n: int, buckets: tuple[int, ...]) -> int | None:
    """The smallest bucket that holds n rows, None when n is above every bucket."""
    return next((b for b in buckets if b >= n), None)


def _generators(seqs: list[Sequence]) -> list[torch.Generator | None]:
    """Each sequence's seeded generator (engine/sampling.py make_generator, on the model's device)."""
    return [cast(torch.Generator | None, s.generator) for s in seqs]


class StepBuffers:
    """A decode step's inputs at fixed offsets of one int64 device buffer (a captured graph reads
    the next step's values at the same addresses), staged in one host buffer (pinned on CUDA).
    temps and top_p hold float64 bit patterns (views). The block tables come last, so a step
    copies its rows' part of them and nothing beyond."""

    FIELDS = ("ids", "pos", "slots", "ctx", "idx", "top_k", "temps", "top_p")

    def __init__(self, rows: int, width: int, device: torch.device) -> None:
        self.rows, self.width = rows, width
        self.off = {name: i * rows for i, name in enumerate(self.FIELDS)}
        self.off["tables"] = len(self.FIELDS) * rows
        total = self.off["tables"] + rows * width
        self.host = torch.zeros(total, dtype=torch.long, pin_memory=device.type == "cuda")
        self.dev = torch.zeros(total, dtype=torch.long, device=device)
        self.np = self.host.numpy()
        self.np_f64 = self.np.view(np.float64)
        self.np[self.off["idx"]:self.off["idx"] + rows] = np.arange(rows)  # decode row i is token i

    def host_field(self, name: str) -> np.ndarray:
        o = self.off[name]
        arr = self.np_f64 if name in ("temps", "top_p") else self.np
        return arr[o:o + (self.rows * self.width if name == "tables" else self.rows)]

    def dev_field(self, name: str, n: int) -> torch.Tensor:
        o = self.off[name]
        view = self.dev[o:o + n * (self.width if name == "tables" else 1)]
        return view.view(torch.float64) if name in ("temps", "top_p") else view

    def upload(self, n: int) -> None:
        """The one host-to-device copy: every field, and the first n rows of the tables."""
        end = self.off["tables"] + n * self.width
        self.dev[:end].copy_(self.host[:end], non_blocking=True)


class CudaRunner(HandbackRunner):
    """engine/runner.py's Runner for CUDA (and, graphs off, any device): see the module doc."""

    def __init__(self, model: LlamaModel, block_size: int, max_num_seqs: int, max_model_len: int,
                 pad_block: int, cuda_graphs: bool) -> None:
        super().__init__(model, block_size)
        self.cap = max_num_seqs
        self.width = -(-max_model_len // block_size) + 1  # a table's blocks, +1 for a block ahead
        self.pad_block = pad_block
        self.buf = StepBuffers(max_num_seqs, self.width, model.device)
        att = model.attention
        # the static decode step needs an attention that reads the tables in place up to each row's
        # context on the device (the SDPA fallback gathers a whole table's width: eager metadata)
        self.static_reason = (None if getattr(att, "reads_tables_in_place", False)
                              else f"attention {att.name} needs per-step metadata")
        self.buckets = graph_buckets(max_num_seqs)
        self._metas: dict[int, AttnMeta] = {}  # per row count: views of the static buffers, made once
        self._graphs: dict[int, tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        self.graph_replays = 0
        self.eager_decode_steps = 0
        self.eager_steps = 0
        if not cuda_graphs:
            self.graph_status = "off: --cuda-graphs off"
        elif model.device.type != "cuda":
            self.graph_status = f"off: device {model.device.type} is not CUDA"
        elif self.static_reason is not None:
            self.graph_status = f"off: {self.static_reason}"
        else:
            self.graph_status = self.capture()

    # -- the static decode step ------------------------------------------------
    def _decode_meta(self, n: int) -> AttnMeta:
        meta = self._metas.get(n)
        if meta is not None:
            return meta
        b = self.buf
        tables = b.dev_field("tables", n)
        meta = self._metas[n] = AttnMeta(
            positions=b.dev_field("pos", n), slot_mapping=b.dev_field("slots", n), decode_idx=b.dev_field("idx", n),
            decode_blocks=tables, decode_mask=None, decode_lens=[], decode_tables=[], prefills=[],
            decode_ctx=b.dev_field("ctx", n), row_tables=tables.view(n, self.width), row_ctx=b.dev_field("ctx", n))
        return meta

    def is_static_decode(self, batch: ScheduledBatch) -> bool:
        """A step the static buffers take: every sequence adds one token after its first, within the cap."""
        return (self.static_reason is None and 0 < len(batch.seqs) <= self.cap
                and all(n == 1 and s.num_computed_tokens > 0 for s, n in zip(batch.seqs, batch.num_new_tokens,
                                                                               strict=True)))

    def fill(self, batch: ScheduledBatch, rows: int) -> None:
        """The step's rows into the host staging buffer; rows past the batch are pad rows."""
        b, bs, w = self.buf, self.block_size, self.width
        ids, pos, slots, ctx = b.host_field("ids"), b.host_field("pos"), b.host_field("slots"), b.host_field("ctx")
        temps, top_p, top_k, tables = b.host_field("temps"), b.host_field("top_p"), b.host_field("top_k"), b.host_field("tables")
        for i, seq in enumerate(batch.seqs):
            p = seq.num_computed_tokens
            table = seq.block_table
            nb = p // bs + 1
            ids[i], pos[i], ctx[i] = seq.token_ids[p], p, p + 1
            slots[i] = table[p // bs] * bs + p % bs
            tables[i * w:i * w + nb] = table[:nb]
            sp = seq.params
            temps[i] = 0.0 if sp.greedy else sp.temperature
            top_p[i], top_k[i] = sp.top_p, sp.top_k
        for i in range(len(batch.seqs), rows):
            ids[i], pos[i], ctx[i], slots[i] = 0, 0, 1, self.pad_block * bs
            tables[i * w] = self.pad_block
            temps[i], top_p[i], top_k[i] = 0.0, 1.0, 0

    def _decode_forward(self, n: int) -> torch.Tensor:
        """The n-row decode over the static buffers -> logits [n, V] (what a graph captures)."""
        hidden = self.model.forward(self.buf.dev_field("ids", n), self._decode_meta(n))
        return self.model.logits(hidden)

    @torch.inference_mode()
    def capture(self) -> str:
        """One CUDA graph per bucket, largest first, sharing one memory pool: the status line."""
        pool = None
        bk = 0
        try:
            for bk in reversed(self.buckets):
                self.fill(ScheduledBatch([], []), bk)
                self.buf.upload(bk)
                side = torch.cuda.Stream()
                side.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(side):
                    for _ in range(2):  # Triton's JIT, cuBLAS's workspace: outside the capture
                        self._decode_forward(bk)
                torch.cuda.current_stream().wait_stream(side)
                g = torch.cuda.CUDAGraph()
                with torch.cuda.graph(g, pool=pool):
                    out = self._decode_forward(bk)
                pool = g.pool()
                self._graphs[bk] = (g, out)
            torch.cuda.synchronize()
        except Exception as exc:  # noqa: BLE001 - any capture failure: eager, with the reason
            self._graphs.clear()
            try:
                torch.cuda.synchronize()
                torch.cuda.empty_cache()
            except Exception:  # noqa: BLE001
                pass
            why = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:200]
            log.warning("CUDA graph capture failed at batch %d, decoding eagerly: %s", bk, why)
            return f"off: capture failed at batch {bk}: {why}"
        return "on: batch buckets " + ",".join(map(str, self.buckets))

    def _static_decode(self, batch: ScheduledBatch) -> list[int | None]:
        b = len(batch.seqs)
        rows = b
        graph = None
        if self._graphs:
            rows = bucket_for(b, self.buckets) or b
            graph = self._graphs.get(rows)
        self.fill(batch, rows)
        hook = self.prepared
        if hook is not None:
            hook()
        self.buf.upload(rows)
        if graph is not None:
            graph[0].replay()
            logits = graph[1][:b]
            self.graph_replays += 1
        else:
            logits = self._decode_forward(rows)[:b]
            self.eager_decode_steps += 1
        buf = self.buf
        toks = sample_on_device(logits, [s.params for s in batch.seqs], _generators(batch.seqs),
                                buf.dev_field("temps", b), buf.dev_field("top_k", b), buf.dev_field("top_p", b)).tolist()
        bad = [i for i, t in enumerate(toks) if t == NONFINITE]
        if bad:
            raise self._fault(bad, buf.dev_field("ids", rows), self._decode_meta(rows))
        return [t if needs_sample(s, 1) else None for s, t in zip(batch.seqs, toks, strict=True)]

    # -- everything else: eager, sampling on the device ------------------------
    def _eager(self, batch: ScheduledBatch) -> list[int | None]:
        self.eager_steps += 1
        input_ids, meta, logit_rows = self.prepare(batch)
        hidden = self.model.forward(input_ids, meta)
        sampled: list[int | None] = [None] * len(batch.seqs)
        if not logit_rows:
            return sampled
        which = [i for i, (seq, n) in enumerate(zip(batch.seqs, batch.num_new_tokens, strict=True))
                 if needs_sample(seq, n)]
        if len(logit_rows) != hidden.shape[0]:
            hidden = hidden[torch.tensor(logit_rows, device=self.device)]
        seqs = [batch.seqs[i] for i in which]
        toks = sample_on_device(self.model.logits(hidden), [s.params for s in seqs],
                                _generators(seqs)).tolist()
        bad = [which[r] for r, t in enumerate(toks) if t == NONFINITE]
        if bad:
            raise self._fault(bad, input_ids, meta)
        for i, tok in zip(which, toks, strict=True):
            sampled[i] = tok
        return sampled

    @torch.inference_mode()
    def execute(self, batch: ScheduledBatch) -> list[int | None]:
        if self.is_static_decode(batch):
            return self._static_decode(batch)
        return self._eager(batch)

    def status(self) -> dict[str, object]:
        """For stats and tests: the graph status and how steps ran."""
        return {"cuda_graphs": self.graph_status, "graph_replays": self.graph_replays,
                "eager_decode_steps": self.eager_decode_steps, "eager_steps": self.eager_steps}

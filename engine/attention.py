"""Attention over the paged KV pool: what each token of a step attends to (AttnMeta, built once
per step by build_attn_meta and shared by every layer) and the backends that compute it, one chosen
per model at start-up (LlamaModel._choose_backends): the C paged kernel on CPU, torch SDPA, per-row
SDPA in deterministic mode, and the Triton paged decode kernel on CUDA (engine/triton_kernels.py).

Every backend takes q [T, H, D] (the step's K/V already written into the pool) and returns [T, H, D].
A backend's decode keeps its shapes per block, never per token: a batch of one sequence attends over
its whole blocks with a mask like any batch (a per-token shape made SDPA pick a new kernel plan, and
cuDNN build a new graph, on every step; CUDA graphs need one shape per batch size anyway).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch
import torch.nn.functional as F

__all__ = ["AttnMeta", "AttentionBackend", "PagedKernelAttention", "PrefillMeta", "RowAttention",
           "SdpaAttention", "TritonPagedAttention", "build_attn_meta"]

# with the C attention kernel a prompt chunk's rows attend one query row at a time over the paged
# KV in place (each row over exactly its own context, like a decode) when the chunk's rows x
# context is at most this; above it the gathered context goes to SDPA's flash kernel, whose
# blocked GEMMs win on long prompts (SmolLM2 heads, 2 threads, ms per layer: 39 rows 0.26 vs 0.47
# SDPA; 128 rows 0.94 vs 1.07; 512 rows 24 vs 17)
PREFILL_KERNEL_WORK = 128 * 128


@dataclass
class PrefillMeta:
    """One sequence's prompt chunk: tokens [start_tok, end_tok) of the step, at positions
    [start_pos, start_pos + n), attending to ctx = start_pos + n cached positions."""

    start_tok: int
    end_tok: int
    blocks: torch.Tensor          # [nb] block ids covering ctx
    start_pos: int
    mask: torch.Tensor | None     # [n, ctx] bool, None when causal from position 0


@dataclass
class AttnMeta:
    """Where each token's KV goes and what each sequence attends to, for one step.
    Built once per step (build_attn_meta) and shared by every layer."""

    positions: torch.Tensor             # [T]
    slot_mapping: torch.Tensor          # [T] flat slot in the pool
    # decodes (one query token per sequence), batched
    decode_idx: torch.Tensor | None     # [B] token index in T
    decode_blocks: torch.Tensor | None  # [B * nb] block ids, rows padded with block 0
    decode_mask: torch.Tensor | None    # [B, 1, 1, nb * bs] valid context positions (built on first use)
    decode_lens: list[int]              # context length per decode, incl. the new token
    decode_tables: list[list[int]]      # unpadded block tables (deterministic mode)
    prefills: list[PrefillMeta]
    decode_ctx: torch.Tensor | None = None  # [B] int64 decode_lens (the C attention kernel)
    # every token row as one query over its own sequence's paged KV (the C attention kernel):
    # its sequence's block table, padded with block 0, and its context length (position + 1)
    row_tables: torch.Tensor | None = None  # [T, width] int64
    row_ctx: torch.Tensor | None = None     # [T] int64
    # every prompt chunk is small enough for the per-row kernel (PREFILL_KERNEL_WORK)
    rows_on_kernel: bool = False


def build_attn_meta(positions: list[int], slots: list[int], dec_idx: list[int], dec_tables: list[list[int]],
                    dec_lens: list[int], prefills: list[tuple[int, int, list[int], int]], block_size: int,
                    device: torch.device) -> AttnMeta:
    # every int64 the step needs in ONE host->tensor copy, then views (a decode step built 5 tensors
    # and a mask: ~65 us of Python per step, ~20 with this)
    t, b = len(positions), len(dec_idx)
    width = max((len(tb) for tb in dec_tables), default=0)
    flat = [blk for tb in dec_tables for blk in (*tb, *([0] * (width - len(tb))))]
    packed = torch.tensor([*positions, *slots, *dec_lens, *dec_idx, *flat], dtype=torch.long, device=device)
    t_pos, t_slots = packed[:t], packed[t:2 * t]
    dec_blocks = t_dec_idx = lens = None
    if b:
        lens, t_dec_idx, dec_blocks = packed[2 * t:2 * t + b], packed[2 * t + b:2 * t + 2 * b], packed[2 * t + 2 * b:]
    pre = []
    small = True
    for s, e, table, start in prefills:
        ctx = start + (e - s)
        small = small and (e - s) * ctx <= PREFILL_KERNEL_WORK
        mask = None
        if start > 0:
            qpos = torch.arange(start, ctx, device=device)[:, None]
            mask = torch.arange(ctx, device=device)[None, :] <= qpos
        nb = -(-ctx // block_size)
        pre.append(PrefillMeta(s, e, torch.tensor(table[:nb], dtype=torch.long, device=device), start, mask))
    row_tables = row_ctx = None
    if not prefills:  # a steady decode: the rows are the decodes, in order
        row_tables, row_ctx = (None if dec_blocks is None else dec_blocks.view(b, width)), lens
    elif device.type == "cpu":
        row_tables, row_ctx = _row_tables(positions, dec_idx, dec_tables, prefills, block_size, device), t_pos + 1
    return AttnMeta(
        positions=t_pos,
        slot_mapping=t_slots,
        decode_idx=t_dec_idx, decode_blocks=dec_blocks, decode_mask=None, decode_lens=dec_lens,
        decode_tables=dec_tables, prefills=pre, decode_ctx=lens if dec_idx else None,
        row_tables=row_tables, row_ctx=row_ctx, rows_on_kernel=small,
    )


def _row_tables(positions: list[int], dec_idx: list[int], dec_tables: list[list[int]],
                prefills: list[tuple[int, int, list[int], int]], block_size: int,
                device: torch.device) -> torch.Tensor:
    """[T, width] int64: each token row's sequence block table (the blocks its context covers,
    padded with block 0), for the per-row attention kernel."""
    tables = [t[: -(-(positions[i] + 1) // block_size)] for i, t in zip(dec_idx, dec_tables, strict=True)]
    tables += [t[: -(-(start + e - s) // block_size)] for s, e, t, start in prefills]
    width = max(len(t) for t in tables)
    seq_tab = torch.tensor([[*t, *([0] * (width - len(t)))] for t in tables], dtype=torch.long, device=device)
    row_seq = [0] * len(positions)
    for j, i in enumerate(dec_idx):
        row_seq[i] = j
    for j, (s, e, _t, _start) in enumerate(prefills, start=len(dec_idx)):
        row_seq[s:e] = [j] * (e - s)
    return seq_tab.index_select(0, torch.tensor(row_seq, dtype=torch.long, device=device))


class AttnHost(Protocol):
    """What a backend reads of its model (engine/model.py LlamaModel): head shapes and the pool's
    block size (set when the pool is allocated, after the backend is chosen)."""

    num_heads: int
    num_kv_heads: int
    head_dim: int
    scale: float
    block_size: int


class AttentionBackend:
    """One step's attention over the paged KV: q [T, H, D] (KV already written) -> [T, H, D]."""

    name = "?"

    def __init__(self, model: AttnHost) -> None:
        self.m = model
        self._scratch: dict[str, torch.Tensor] = {}  # grow-only decode KV gathers (_gather's buf)

    def attend(self, q: torch.Tensor, kc: torch.Tensor, vc: torch.Tensor, meta: AttnMeta) -> torch.Tensor:
        raise NotImplementedError

    def _gather(self, cache: torch.Tensor, blocks: torch.Tensor, buf: str | None = None) -> torch.Tensor:
        """Whole blocks out of the pool: [slots, KVH, D] viewed as [blocks, bs*KVH*D] rows, so
        index_select copies contiguous block-sized rows (far cheaper than per-slot indexing).
        With `buf`, into a grow-only scratch buffer of that name: a fresh multi-MB tensor per
        layer costs page faults every time (measured: index_select into a reused buffer
        ~2x faster than allocating). The result is only valid until the next gather into buf."""
        width = self.m.block_size * self.m.num_kv_heads * self.m.head_dim
        rows = cache.view(-1, width)
        if buf is None:
            return rows.index_select(0, blocks)
        n = blocks.shape[0] * width
        scratch = self._scratch.get(buf)
        if scratch is None or scratch.numel() < n:
            scratch = self._scratch[buf] = torch.empty(max(n, 2 * (0 if scratch is None else scratch.numel())),
                                                       dtype=cache.dtype, device=cache.device)
        out = scratch[:n].view(blocks.shape[0], width)
        return torch.index_select(rows, 0, blocks, out=out)

    def _context(self, cache: torch.Tensor, blocks: torch.Tensor, ctx: int) -> torch.Tensor:
        """One sequence's first ctx positions as [1, KVH, ctx, D]."""
        return self._gather(cache, blocks).view(-1, self.m.num_kv_heads, self.m.head_dim)[:ctx].transpose(0, 1).unsqueeze(0)

    def _attend_rows(self, q: torch.Tensor, kc: torch.Tensor, vc: torch.Tensor, meta: AttnMeta,
                     out: torch.Tensor) -> None:
        """Batch-invariant attention: each query row alone over exactly its own context."""
        bs = self.m.block_size
        dev = q.device
        seqs: list[tuple[list[int], torch.Tensor, int]] = []  # (token indices, blocks, ctx of the last row)
        if meta.decode_idx is not None:
            for j, ti in enumerate(meta.decode_idx.tolist()):
                ctx = meta.decode_lens[j]
                table = meta.decode_tables[j][: -(-ctx // bs)]
                seqs.append(([ti], torch.tensor(table, dtype=torch.long, device=dev), ctx))
        for p in meta.prefills:
            seqs.append((list(range(p.start_tok, p.end_tok)), p.blocks, p.start_pos + (p.end_tok - p.start_tok)))
        for rows, blocks, last_ctx in seqs:
            kall = self._context(kc, blocks, last_ctx)  # gathered once per sequence
            vall = self._context(vc, blocks, last_ctx)
            first_ctx = last_ctx - len(rows) + 1
            for i, ti in enumerate(rows):
                ctx = first_ctx + i
                qr = q[ti].view(1, self.m.num_heads, 1, self.m.head_dim)
                out[ti] = F.scaled_dot_product_attention(qr, kall[:, :, :ctx], vall[:, :, :ctx], enable_gqa=True,
                                                         scale=self.m.scale)[0, :, 0]


class RowAttention(AttentionBackend):
    """Deterministic mode: each query row alone over exactly its own context (torch SDPA)."""

    name = "torch-sdpa per row"

    def attend(self, q: torch.Tensor, kc: torch.Tensor, vc: torch.Tensor, meta: AttnMeta) -> torch.Tensor:
        out = torch.empty_like(q)
        self._attend_rows(q, kc, vc, meta, out)
        return out


class SdpaAttention(AttentionBackend):
    """torch SDPA: decodes over their blocks gathered into reused buffers (one sequence: exactly its
    context, no mask), each prompt chunk over its gathered context (causal or masked)."""

    name = "torch-sdpa"

    def attend(self, q: torch.Tensor, kc: torch.Tensor, vc: torch.Tensor, meta: AttnMeta) -> torch.Tensor:
        if meta.decode_idx is not None and not meta.prefills and meta.decode_idx.shape[0] == q.shape[0]:
            # steady decode: every token is one sequence's next token, in order -> no scatter
            return self.decode(q, kc, vc, meta)
        return self.mixed(q, kc, vc, meta)

    def mixed(self, q: torch.Tensor, kc: torch.Tensor, vc: torch.Tensor, meta: AttnMeta) -> torch.Tensor:
        m = self.m
        out = torch.empty_like(q)
        if meta.decode_idx is not None:
            out[meta.decode_idx] = self.decode(q[meta.decode_idx], kc, vc, meta)
        for p in meta.prefills:
            ctx = p.start_pos + (p.end_tok - p.start_tok)
            kk = self._context(kc, p.blocks, ctx)  # [1, KVH, ctx, D]
            vv = self._context(vc, p.blocks, ctx)
            qp = q[p.start_tok:p.end_tok].transpose(0, 1).unsqueeze(0)  # [1, H, n, D]
            if p.mask is None:
                op = F.scaled_dot_product_attention(qp, kk, vv, is_causal=True, enable_gqa=True, scale=m.scale)
            else:
                op = F.scaled_dot_product_attention(qp, kk, vv, attn_mask=p.mask, enable_gqa=True, scale=m.scale)
            out[p.start_tok:p.end_tok] = op[0].transpose(0, 1)
        return out

    def decode(self, qd: torch.Tensor, kc: torch.Tensor, vc: torch.Tensor, meta: AttnMeta) -> torch.Tensor:
        """qd [B, H, D], one query per sequence -> [B, H, D]."""
        m = self.m
        assert meta.decode_blocks is not None
        b = qd.shape[0]
        nkv, d = m.num_kv_heads, m.head_dim
        kk = self._gather(kc, meta.decode_blocks, "k").view(b, -1, nkv, d).transpose(1, 2)  # [B, KVH, L, D]
        vv = self._gather(vc, meta.decode_blocks, "v").view(b, -1, nkv, d).transpose(1, 2)
        if meta.decode_mask is None and meta.decode_ctx is not None:  # once per step, shared by the layers
            span = torch.arange(meta.decode_blocks.shape[0] // b * m.block_size, device=qd.device)
            meta.decode_mask = (span[None, :] < meta.decode_ctx[:, None])[:, None, None, :]
        # over whole blocks with the mask at every batch size, one sequence too (it was trimmed to its
        # exact context: a new attention shape every token, issue 35): the shape changes per block
        mask = meta.decode_mask
        od = F.scaled_dot_product_attention(qd.unsqueeze(2), kk, vv, attn_mask=mask, enable_gqa=True,
                                            scale=m.scale)
        return od.squeeze(2)


class PagedKernelAttention(SdpaAttention):
    """The C paged attention kernel reads the KV in place (no gather): decodes, and prompt chunks
    small enough (PREFILL_KERNEL_WORK) with each row over its own context; longer prompt chunks go
    to SDPA's flash kernel, whose blocked GEMMs win there."""

    name = "c-paged"

    def attend(self, q: torch.Tensor, kc: torch.Tensor, vc: torch.Tensor, meta: AttnMeta) -> torch.Tensor:
        if meta.decode_idx is not None and not meta.prefills and meta.decode_idx.shape[0] == q.shape[0]:
            return self.decode(q, kc, vc, meta)
        if meta.rows_on_kernel and meta.row_tables is not None and meta.row_ctx is not None:
            from zgtool.engine.cpu_kernels import paged_decode_attention

            return paged_decode_attention(q, kc, vc, meta.row_tables, meta.row_ctx, self.m.block_size, self.m.scale)
        return self.mixed(q, kc, vc, meta)

    def decode(self, qd: torch.Tensor, kc: torch.Tensor, vc: torch.Tensor, meta: AttnMeta) -> torch.Tensor:
        if meta.decode_ctx is None or meta.decode_blocks is None:
            return super().decode(qd, kc, vc, meta)
        from zgtool.engine.cpu_kernels import paged_decode_attention

        return paged_decode_attention(qd, kc, vc, meta.decode_blocks.view(qd.shape[0], -1), meta.decode_ctx,
                                      self.m.block_size, self.m.scale)


def triton_available() -> str | None:
    """None when the Triton kernels (engine/triton_kernels.py) can run here, else why not."""
    try:
        import triton  # noqa: F401
    except Exception as exc:  # noqa: BLE001 - any import failure means: not here
        return f"triton not importable ({type(exc).__name__}: {exc})"
    return None


class TritonPagedAttention(SdpaAttention):
    """CUDA: decodes on the Triton paged decode kernel, which reads the KV in place over each row's
    block table up to its context length, both read on the device (no gather, no mask, no host
    value: a CUDA graph replays it with new tables); prompt chunks on SDPA (flash) per chunk."""

    name = "triton-paged"
    reads_tables_in_place = True  # the block table's width costs nothing (engine/cuda_runner.py)

    def decode(self, qd: torch.Tensor, kc: torch.Tensor, vc: torch.Tensor, meta: AttnMeta) -> torch.Tensor:
        assert meta.decode_ctx is not None and meta.decode_blocks is not None
        from zgtool.engine.triton_kernels import paged_decode_attention

        return paged_decode_attention(qd, kc, vc, meta.decode_blocks.view(qd.shape[0], -1), meta.decode_ctx,
                                      self.m.block_size, self.m.scale)

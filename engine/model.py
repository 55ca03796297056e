"""Llama-family decoder forward (RMSNorm, RoPE incl. Llama-3 scaling, GQA, SwiGLU, Qwen2
q/k/v biases, tied embeddings) over a paged KV pool.

Deterministic mode (batch-invariant): every linear layer runs on fixed 32-row tiles (the
last one zero-padded) so each row meets the same GEMM shape whatever shares its batch, and
attention runs one query row at a time over exactly that row's context — a row's result
never depends on its neighbours. Cost: padded rows and per-row attention calls (see
bench/engine_throughput.py for the measured price).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from zgtool.engine.presets import ModelSpec

DET_TILE = 32


@dataclass
class LayerWeights:
    input_norm: torch.Tensor
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    o: torch.Tensor
    q_bias: torch.Tensor | None
    k_bias: torch.Tensor | None
    v_bias: torch.Tensor | None
    post_norm: torch.Tensor
    gate: torch.Tensor
    up: torch.Tensor
    down: torch.Tensor


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
    decode_mask: torch.Tensor | None    # [B, 1, 1, nb * bs] valid context positions
    decode_lens: list[int]              # context length per decode, incl. the new token
    decode_tables: list[list[int]]      # unpadded block tables (deterministic mode)
    prefills: list[PrefillMeta]


def build_attn_meta(positions: list[int], slots: list[int], dec_idx: list[int], dec_tables: list[list[int]],
                    dec_lens: list[int], prefills: list[tuple[int, int, list[int], int]], block_size: int,
                    device: torch.device) -> AttnMeta:
    dec_blocks = dec_mask = t_dec_idx = None
    if dec_idx:
        width = max(len(t) for t in dec_tables)
        flat = [b for t in dec_tables for b in (*t, *([0] * (width - len(t))))]
        dec_blocks = torch.tensor(flat, dtype=torch.long, device=device)
        lens = torch.tensor(dec_lens, dtype=torch.long, device=device)
        dec_mask = (torch.arange(width * block_size, device=device)[None, :] < lens[:, None])[:, None, None, :]
        t_dec_idx = torch.tensor(dec_idx, dtype=torch.long, device=device)
    pre = []
    for s, e, table, start in prefills:
        ctx = start + (e - s)
        mask = None
        if start > 0:
            qpos = torch.arange(start, ctx, device=device)[:, None]
            mask = torch.arange(ctx, device=device)[None, :] <= qpos
        nb = -(-ctx // block_size)
        pre.append(PrefillMeta(s, e, torch.tensor(table[:nb], dtype=torch.long, device=device), start, mask))
    return AttnMeta(
        positions=torch.tensor(positions, dtype=torch.long, device=device),
        slot_mapping=torch.tensor(slots, dtype=torch.long, device=device),
        decode_idx=t_dec_idx, decode_blocks=dec_blocks, decode_mask=dec_mask, decode_lens=dec_lens,
        decode_tables=dec_tables, prefills=pre,
    )


def rope_inv_freq(spec: ModelSpec) -> torch.Tensor:
    d = spec.dim_per_head
    inv = 1.0 / (spec.rope_theta ** (torch.arange(0, d, 2, dtype=torch.int64).float() / d))
    sc = spec.rope_scaling or {}
    kind = sc.get("rope_type") or sc.get("type") or "default"
    if kind == "default":
        return inv
    if kind == "linear":
        return inv / float(sc["factor"])
    if kind == "llama3":
        factor = float(sc["factor"])
        low, high = float(sc["low_freq_factor"]), float(sc["high_freq_factor"])
        old_len = float(sc["original_max_position_embeddings"])
        low_wavelen, high_wavelen = old_len / low, old_len / high
        wavelen = 2 * math.pi / inv
        inv_l = torch.where(wavelen > low_wavelen, inv / factor, inv)
        smooth = (old_len / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * inv_l / factor + smooth * inv_l
        medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
        return torch.where(medium, smoothed, inv_l)
    from zgtool.engine.errors import ModelLoadError

    raise ModelLoadError(f"unsupported rope_scaling type {kind!r} (supported: default, linear, llama3)")


def rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return w * xf.to(x.dtype)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


class LlamaModel:
    """Holds the weights and a paged KV pool; `forward` computes one step's hidden states."""

    def __init__(self, spec: ModelSpec, weights: dict[str, torch.Tensor], device: torch.device,
                 dtype: torch.dtype, deterministic: bool = False) -> None:
        self.spec = spec
        self.device = device
        self.dtype = dtype
        self.deterministic = deterministic
        self.num_heads = spec.num_heads
        self.num_kv_heads = spec.num_kv_heads
        self.head_dim = spec.dim_per_head
        self.scale = self.head_dim ** -0.5

        def w(name: str) -> torch.Tensor:
            return weights[name].to(device=device, dtype=dtype).contiguous()

        def wb(name: str) -> torch.Tensor | None:
            return w(name) if name in weights else None

        self.embed = w("model.embed_tokens.weight")
        self.norm = w("model.norm.weight")
        self.lm_head = self.embed if spec.tie_word_embeddings or "lm_head.weight" not in weights else w("lm_head.weight")
        self.layers: list[LayerWeights] = []
        for i in range(spec.num_layers):
            p = f"model.layers.{i}."
            self.layers.append(LayerWeights(
                input_norm=w(p + "input_layernorm.weight"),
                q=w(p + "self_attn.q_proj.weight"), k=w(p + "self_attn.k_proj.weight"),
                v=w(p + "self_attn.v_proj.weight"), o=w(p + "self_attn.o_proj.weight"),
                q_bias=wb(p + "self_attn.q_proj.bias"), k_bias=wb(p + "self_attn.k_proj.bias"),
                v_bias=wb(p + "self_attn.v_proj.bias"),
                post_norm=w(p + "post_attention_layernorm.weight"),
                gate=w(p + "mlp.gate_proj.weight"), up=w(p + "mlp.up_proj.weight"),
                down=w(p + "mlp.down_proj.weight"),
            ))
        inv = rope_inv_freq(spec)
        pos = torch.arange(spec.max_position_embeddings, dtype=torch.float32)
        freqs = torch.outer(pos, inv)
        emb = torch.cat((freqs, freqs), dim=-1)
        self.cos = emb.cos().to(device=device, dtype=dtype)  # [P, D]
        self.sin = emb.sin().to(device=device, dtype=dtype)
        self.k_cache: list[torch.Tensor] = []
        self.v_cache: list[torch.Tensor] = []
        self.block_size = 0

    # -- KV pool ----------------------------------------------------------
    def kv_bytes_per_block(self, block_size: int) -> int:
        elem = torch.tensor([], dtype=self.dtype).element_size()
        return 2 * self.spec.num_layers * block_size * self.num_kv_heads * self.head_dim * elem

    def allocate_kv(self, num_blocks: int, block_size: int) -> None:
        shape = (num_blocks * block_size, self.num_kv_heads, self.head_dim)  # [slots, KVH, D]
        self.k_cache = [torch.zeros(shape, device=self.device, dtype=self.dtype) for _ in self.layers]
        self.v_cache = [torch.zeros(shape, device=self.device, dtype=self.dtype) for _ in self.layers]
        self.block_size = block_size

    def copy_blocks(self, mapping: dict[int, int]) -> None:
        """Move KV of block old -> new for every pair (compaction). Reads happen before writes."""
        if not mapping:
            return
        bs = self.block_size
        old = torch.tensor(sorted(mapping), device=self.device)
        new = torch.tensor([mapping[o] for o in sorted(mapping)], device=self.device)
        off = torch.arange(bs, device=self.device)
        src = (old[:, None] * bs + off).reshape(-1)
        dst = (new[:, None] * bs + off).reshape(-1)
        for kc, vc in zip(self.k_cache, self.v_cache, strict=True):
            kc[dst] = kc[src].clone()
            vc[dst] = vc[src].clone()

    # -- forward ----------------------------------------------------------
    def linear(self, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None = None) -> torch.Tensor:
        if not self.deterministic:
            return F.linear(x, w, b)
        n = x.shape[0]
        pad = (-n) % DET_TILE
        if pad:
            x = torch.cat([x, x.new_zeros(pad, x.shape[1])])
        outs = [F.linear(t, w, b) for t in x.split(DET_TILE)]
        return torch.cat(outs)[:n]

    @torch.inference_mode()
    def forward(self, input_ids: torch.Tensor, meta: AttnMeta) -> torch.Tensor:
        """input_ids [T] -> final hidden states [T, hidden] (KV written into the pool)."""
        x = self.embed[input_ids]  # [T, hidden]
        cos = self.cos[meta.positions].unsqueeze(1)  # [T, 1, D]
        sin = self.sin[meta.positions].unsqueeze(1)
        eps = self.spec.rms_norm_eps
        for li, lw in enumerate(self.layers):
            h = rms_norm(x, lw.input_norm, eps)
            h = self._attention(li, lw, h, cos, sin, meta)
            x = x + h
            h = rms_norm(x, lw.post_norm, eps)
            h = self.linear(F.silu(self.linear(h, lw.gate)) * self.linear(h, lw.up), lw.down)
            x = x + h
        return rms_norm(x, self.norm, eps)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.linear(hidden, self.lm_head).float()

    def _attention(self, li: int, lw: LayerWeights, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                   meta: AttnMeta) -> torch.Tensor:
        t = h.shape[0]
        q = self.linear(h, lw.q, lw.q_bias).view(t, self.num_heads, self.head_dim)
        k = self.linear(h, lw.k, lw.k_bias).view(t, self.num_kv_heads, self.head_dim)
        v = self.linear(h, lw.v, lw.v_bias).view(t, self.num_kv_heads, self.head_dim)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        kc, vc = self.k_cache[li], self.v_cache[li]
        kc[meta.slot_mapping] = k
        vc[meta.slot_mapping] = v
        out = torch.empty_like(q)  # [T, H, D]
        if self.deterministic:
            self._attend_rows(q, kc, vc, meta, out)
        else:
            if meta.decode_idx is not None:
                assert meta.decode_blocks is not None
                b = meta.decode_idx.shape[0]
                kk = self._gather(kc, meta.decode_blocks).view(b, -1, self.num_kv_heads, self.head_dim).transpose(1, 2)
                vv = self._gather(vc, meta.decode_blocks).view(b, -1, self.num_kv_heads, self.head_dim).transpose(1, 2)
                qd = q[meta.decode_idx].unsqueeze(2)  # [B, H, 1, D]
                od = F.scaled_dot_product_attention(qd, kk, vv, attn_mask=meta.decode_mask, enable_gqa=True,
                                                    scale=self.scale)
                out[meta.decode_idx] = od.squeeze(2)
            for p in meta.prefills:
                ctx = p.start_pos + (p.end_tok - p.start_tok)
                kk = self._context(kc, p.blocks, ctx)  # [1, KVH, ctx, D]
                vv = self._context(vc, p.blocks, ctx)
                qp = q[p.start_tok:p.end_tok].transpose(0, 1).unsqueeze(0)  # [1, H, n, D]
                if p.mask is None:
                    op = F.scaled_dot_product_attention(qp, kk, vv, is_causal=True, enable_gqa=True, scale=self.scale)
                else:
                    op = F.scaled_dot_product_attention(qp, kk, vv, attn_mask=p.mask, enable_gqa=True,
                                                        scale=self.scale)
                out[p.start_tok:p.end_tok] = op[0].transpose(0, 1)
        return self.linear(out.reshape(t, -1), lw.o)

    def _gather(self, cache: torch.Tensor, blocks: torch.Tensor) -> torch.Tensor:
        """Whole blocks out of the pool: [slots, KVH, D] viewed as [blocks, bs*KVH*D] rows, so
        index_select copies contiguous block-sized rows (far cheaper than per-slot indexing)."""
        rows = cache.view(-1, self.block_size * self.num_kv_heads * self.head_dim)
        return rows.index_select(0, blocks)

    def _context(self, cache: torch.Tensor, blocks: torch.Tensor, ctx: int) -> torch.Tensor:
        """One sequence's first ctx positions as [1, KVH, ctx, D]."""
        return self._gather(cache, blocks).view(-1, self.num_kv_heads, self.head_dim)[:ctx].transpose(0, 1).unsqueeze(0)

    def _attend_rows(self, q: torch.Tensor, kc: torch.Tensor, vc: torch.Tensor, meta: AttnMeta,
                     out: torch.Tensor) -> None:
        """Batch-invariant attention: each query row alone over exactly its own context."""
        bs = self.block_size
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
                qr = q[ti].view(1, self.num_heads, 1, self.head_dim)
                out[ti] = F.scaled_dot_product_attention(qr, kall[:, :, :ctx], vall[:, :, :ctx], enable_gqa=True,
                                                         scale=self.scale)[0, :, 0]

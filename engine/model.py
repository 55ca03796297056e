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

from zgtool.engine.backends import (
    DET_TILE,
    F32KernelLinear,
    F32KernelLmHead,
    Int8Linear,
    Int8LmHead,
    KernelPlan,
    LinearMethod,
    LmHead,
    TiledLinear,
    TorchLinear,
    TorchLmHead,
    TransposedTorchLinear,
)
from zgtool.engine.presets import ModelSpec
from zgtool.engine.quant import WEIGHT_INT8, Int8Weight, quantize_linear

__all__ = ["DET_TILE", "AttnMeta", "LlamaModel", "build_attn_meta"]
# int8: from this many rows a projection is dequantized into a reused fp32 buffer and run by MKL.
# With the int8 kernel's 4x3 register blocks and L2-sized chunks it still led MKL (dequantized) at
# 512 rows (SmolLM2 projections x 30 layers, 2 threads: 1069 vs 1132 ms; 256 rows 529 vs 602), so
# only a step budget above the default 512 tokens reaches MKL (deterministic mode's 32-row tiles
# always take the kernel)
INT8_DEQUANT_ROWS = 1024
# fp32 with the C kernels: every projection runs on f32_gemm ([out, in], output channels split over
# the pool's threads), prompt chunks too: SmolLM2's projections x 30 layers, 2 threads, ms,
# f32_gemm vs MKL: 7 rows 22 vs 58; 32 rows 66-124 vs 104-124; 128 rows 198-258 vs 277-314; 512
# rows 992 vs 1132 (interleaved, noisy box) -- and MKL's OpenMP team stalls whenever the other
# core is busy (1.9 s instead of 0.1 s for 32 rows beside two busy processes; the pool 0.2 s)
# with the C attention kernel a prompt chunk's rows attend one query row at a time over the paged
# KV in place (each row over exactly its own context, like a decode) when the chunk's rows x
# context is at most this; above it the gathered context goes to SDPA's flash kernel, whose
# blocked GEMMs win on long prompts (SmolLM2 heads, 2 threads, ms per layer: 39 rows 0.26 vs 0.47
# SDPA; 128 rows 0.94 vs 1.07; 512 rows 24 vs 17)
PREFILL_KERNEL_WORK = 128 * 128


@dataclass
class LayerWeights:
    """One decoder layer. On CPU in float32 with the C kernels (engine/cpu_kernels.py) the
    projections are [out, in] and run on f32_gemm, decodes and prompt chunks alike. Without the kernels they are stored TRANSPOSED, [in, out] contiguous, and applied
    with mm/addmm: MKL's GEMV/small-M GEMM ran 15-50% faster on that layout than F.linear's
    [out, in] (measured on the 2-core AVX2 box, 1 thread). Every other dtype/device keeps
    [out, in] and F.linear: bf16/fp16 mm on [in, out]
    falls to a slow path there (15-20x slower). q/k/v are one fused matrix, so RoPE rotates q
    and k in one pass. With dtype int8 the projections are int8 weights (Int8Weight,
    engine/quant.py), applied by LlamaModel.linear like the tensors."""

    input_norm: torch.Tensor
    qkv: torch.Tensor
    qkv_bias: torch.Tensor | None
    o: torch.Tensor
    post_norm: torch.Tensor
    gate_up: torch.Tensor  # gate and up concatenated along out: one projection, then silu(gate) * up
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
    if x.dtype == torch.float32:  # one fused op, bit-identical to the formula below in fp32
        return F.rms_norm(x, (x.shape[-1],), w, eps)
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
        # int8: the projections and lm_head are quantized; everything else computes in fp32
        self.quantized = dtype == WEIGHT_INT8
        if self.quantized:
            if device.type != "cpu":
                from zgtool.engine.errors import ModelLoadError

                raise ModelLoadError("dtype int8 runs on CPU only")
            dtype = torch.float32
        self.dtype = dtype
        self.deterministic = deterministic
        self.num_heads = spec.num_heads
        self.num_kv_heads = spec.num_kv_heads
        self.head_dim = spec.dim_per_head
        self.scale = self.head_dim ** -0.5

        # the weights dict is consumed: each tensor is dropped once converted, so converting
        # never holds two copies of the model
        def w(name: str) -> torch.Tensor:
            return weights.pop(name).to(device=device, dtype=dtype).contiguous()

        # which C kernels this model uses on this machine, each with the reason when not (engine/backends.py)
        self.plan = KernelPlan.choose(spec.hidden_size, spec.intermediate_size, self.head_dim, device, dtype,
                                      self.quantized)
        # f32_gemm's per-channel scale: ones, as long as the widest output of any GEMM it scales (the
        # vocabulary, qkv, gate_up = 2 x intermediate, o/down = hidden). The C step reads N scales per
        # GEMM with no length to check against: a short table was read past its end, which gave NaN
        # logits on every checkpoint whose vocabulary is smaller than 2 x intermediate (issue 26).
        widest = max(spec.vocab_size, (self.num_heads + 2 * self.num_kv_heads) * self.head_dim,
                     2 * spec.intermediate_size, spec.hidden_size)
        on_f32_kernels = not self.quantized and (self.plan.norm_off is None or self.plan.gemm_off is None)
        self._lm_ones = torch.ones(widest) if on_f32_kernels else None
        # the projections' layout, fixed at load by the linear method that will apply them
        self._layout = self._layout_method()

        def wt(*names: str) -> torch.Tensor:  # a projection (concatenated along out), in the layout's form
            parts = [weights.pop(n).to(device=device, dtype=dtype) for n in names]
            return self._layout.prepare(torch.cat(parts) if len(parts) > 1 else parts[0])

        tied = spec.tie_word_embeddings or "lm_head.weight" not in weights
        self.norm = w("model.norm.weight")
        # the lm_head stays [V, hidden] (F.linear) in every dtype: for SmolLM2's 49152 x 576 at
        # 16 rows MKL took 34 ms on it vs 46 ms transposed; tied, it is the embedding itself
        self.embed = w("model.embed_tokens.weight")
        self.lm_head = self.embed if tied else w("lm_head.weight")
        # int8: the lm_head in int8 too (SmolLM2's 49152 x 576: 1.3x faster at 1 row, 3x at 16); the fp32
        # embedding stays for the token lookup
        self._lm_head_q = quantize_linear(self.lm_head) if self.quantized else None
        if self.quantized and not tied:
            self.lm_head = self.embed  # the fp32 copy is never read: do not hold it
        self.layers: list[LayerWeights] = []
        kv_dim = self.num_kv_heads * self.head_dim
        for i in range(spec.num_layers):
            p = f"model.layers.{i}."
            a, m = p + "self_attn.", p + "mlp."
            biases = [weights.pop(a + f"{n}_proj.bias", None) for n in "qkv"]
            qkv_bias = None
            if any(b is not None for b in biases):
                sizes = (self.num_heads * self.head_dim, kv_dim, kv_dim)
                qkv_bias = torch.cat([b if b is not None else torch.zeros(n) for b, n in zip(biases, sizes, strict=True)])
                qkv_bias = qkv_bias.to(device=device, dtype=dtype).contiguous()
            self.layers.append(LayerWeights(
                input_norm=w(p + "input_layernorm.weight"),
                qkv=wt(a + "q_proj.weight", a + "k_proj.weight", a + "v_proj.weight"),
                qkv_bias=qkv_bias,
                o=wt(a + "o_proj.weight"),
                post_norm=w(p + "post_attention_layernorm.weight"),
                gate_up=wt(m + "gate_proj.weight", m + "up_proj.weight"),
                down=wt(m + "down_proj.weight"),
            ))
        self._scratch: dict[str, torch.Tensor] = {}  # grow-only step buffers (decode KV gathers)
        self._tokens = torch.empty(64, dtype=torch.long)  # greedy_tokens' output, grow-only
        self._argmax_shape = (0, 0)  # (rows, vocab) of the last greedy_tokens call
        self._ptrs: object | None = None
        self._ptrs_key = -1
        self._kv_generation = 0
        # what is switched on, from the plan (the A/B benches and kernel tests may switch a piece off
        # through the properties below, which choose the backends again)
        self._use = {"gemm": self.plan.gemm_off is None, "attention": self.plan.attention_off is None,
                     "norm": self.plan.norm_off is None, "glue": self.plan.glue_off is None,
                     "lm_head": self.plan.norm_off is None and not self.quantized, "fused": True}
        self._choose_backends()
        inv = rope_inv_freq(spec)
        pos = torch.arange(spec.max_position_embeddings, dtype=torch.float32)
        freqs = torch.outer(pos, inv)
        emb = torch.cat((freqs, freqs), dim=-1)
        self.cos = emb.cos().to(device=device, dtype=dtype)  # [P, D]
        sin = emb.sin()
        half = sin.shape[-1] // 2
        # rotate_half(x) * sin == flip_halves(x) * (-sin_lo, +sin_hi): one table, no neg/cat per layer
        self.sin_signed = torch.cat((-sin[:, :half], sin[:, half:]), dim=-1).to(device=device, dtype=dtype)
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
        self._kv_generation += 1  # step_layers' pointer table must be rebuilt

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

    # -- backends, chosen once ----------------------------------------------
    def _layout_method(self) -> LinearMethod:
        """The projections' layout at load: int8 weights; [out, in] for the C fp32 GEMM; [in, out] for
        MKL's mm when fp32 runs on torch on CPU; [out, in] for F.linear everywhere else."""
        if self.quantized:
            return Int8Linear(None if self.deterministic else INT8_DEQUANT_ROWS, self._dequantized)
        if self._lm_ones is not None and self.plan.gemm_off is None:
            return F32KernelLinear(self._lm_ones)
        if self.device.type == "cpu" and self.dtype == torch.float32:
            return TransposedTorchLinear()
        return TorchLinear()

    def _choose_backends(self) -> None:
        """The linear method, lm_head, attention backend, glue and layer driver, from the plan and
        what is switched on: the forward then calls them without asking what the machine supports."""
        use, det = self._use, self.deterministic
        lin: LinearMethod = self._layout
        if isinstance(lin, F32KernelLinear) and not use["gemm"]:
            lin = TorchLinear()  # the same [out, in] weights on MKL's F.linear
        self.linear_method: LinearMethod = TiledLinear(lin) if det else lin
        self.lm_head_method: LmHead
        if self._lm_head_q is not None:
            self.lm_head_method = Int8LmHead(self._lm_head_q)
        elif use["lm_head"] and self._lm_ones is not None:
            self.lm_head_method = F32KernelLmHead(self.lm_head, self._lm_ones)
        else:
            self.lm_head_method = TorchLmHead(self.lm_head, det)
        self.attention: AttentionBackend = (RowAttention(self) if det else PagedKernelAttention(self)
                                            if use["attention"] else SdpaAttention(self))
        self._rope_kv = self._rope_kv_c if use["glue"] else self._rope_kv_torch
        self._silu_mul = self._silu_mul_c if use["glue"] else self._silu_mul_torch
        self._one_call_ok = (not det and use["fused"] and use["attention"] and use["norm"] and use["glue"]
                             and (self.quantized or isinstance(lin, F32KernelLinear)))
        self._layers_fn = (self._layers_c_step if self._one_call_ok else self._forward_fused_norms
                           if use["norm"] else self._forward_torch)

    @property
    def backend_name(self) -> str:
        """How this model computes, for banners and results: "c-kernels" (a step's layers in one C
        call), else "torch: <the first reason a kernel is off>" (naming the pieces still on C)."""
        if self._one_call_ok:
            return "c-kernels"
        plan = self.plan
        reason = next((r for r in (plan.library_off, plan.gemm_off, plan.attention_off, plan.norm_off,
                                   plan.glue_off) if r is not None),
                      "deterministic mode" if self.deterministic else "switched off")
        on_c = [n for n, b in self.backends.items() if b.startswith("c-")]
        return f"torch: {reason}" + (f" (on the C kernels: {', '.join(on_c)})" if on_c else "")

    @property
    def backends(self) -> dict[str, str]:
        """Each chosen backend by name (linear, lm_head, attention, norm, glue, layers)."""
        return {"linear": self.linear_method.name, "lm_head": self.lm_head_method.name,
                "attention": self.attention.name, "norm": "c-add-rms-norm" if self._use["norm"] else "torch",
                "glue": "c-rope-kv-silu" if self._use["glue"] else "torch",
                "layers": "c-step" if self._one_call_ok else "per-layer"}

    def _switch(self, piece: str, on: bool) -> None:
        allowed = {"gemm": self.plan.gemm_off, "attention": self.plan.attention_off, "norm": self.plan.norm_off,
                   "glue": self.plan.glue_off, "lm_head": None if self._lm_ones is not None else "no table",
                   "fused": None}[piece]
        self._use[piece] = bool(on) and allowed is None
        self._choose_backends()

    # A/B switches for benches and kernel tests (bench/engine_decode_ab.py): switching a piece off
    # (or back on where the plan allows it) chooses the backends again.
    attn_kernel = property(lambda self: self._use["attention"], lambda self, on: self._switch("attention", on))
    fast_norm = property(lambda self: self._use["norm"], lambda self, on: self._switch("norm", on))
    fast_glue = property(lambda self: self._use["glue"], lambda self, on: self._switch("glue", on))
    fast_lm_head = property(lambda self: self._use["lm_head"], lambda self, on: self._switch("lm_head", on))
    fused_layers = property(lambda self: self._use["fused"], lambda self, on: self._switch("fused", on))
    f32_kernel = property(lambda self: isinstance(self.linear_method, F32KernelLinear),
                          lambda self, on: self._switch("gemm", on))

    # -- forward ----------------------------------------------------------
    def _dequantized(self, w: Int8Weight) -> torch.Tensor:
        """w as fp32 [out, in] in a grow-only scratch buffer, valid until the next call."""
        n = w.q.numel()
        from zgtool.engine.cpu_kernels import w8_dequant

        return w8_dequant(w.q, w.scale, self._buf("deq", n)[:n].view(w.q.shape))

    def linear(self, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None = None) -> torch.Tensor:
        """x [n, in] times a projection (in the layout its linear method chose) (+ b)."""
        return self.linear_method.apply(x, w, b)

    @torch.inference_mode()
    def forward(self, input_ids: torch.Tensor, meta: AttnMeta) -> torch.Tensor:
        """input_ids [T] -> final hidden states [T, hidden] (KV written into the pool)."""
        x = torch.index_select(self.embed, 0, input_ids)  # [T, hidden] (a fresh tensor: residual adds go in place)
        return self._layers_fn(x, meta)

    def _forward_torch(self, x: torch.Tensor, meta: AttnMeta) -> torch.Tensor:
        cos = self.cos[meta.positions].unsqueeze(1)  # [T, 1, D]
        sin = self.sin_signed[meta.positions].unsqueeze(1)
        eps = self.spec.rms_norm_eps
        for li, lw in enumerate(self.layers):
            h = rms_norm(x, lw.input_norm, eps)
            x.add_(self._attention(li, lw, h, cos, sin, meta))
            h = rms_norm(x, lw.post_norm, eps)
            x.add_(self.linear(self._silu_mul(self.linear(h, lw.gate_up)), lw.down))
        return rms_norm(x, self.norm, eps)

    def _layers_c_step(self, x: torch.Tensor, meta: AttnMeta) -> torch.Tensor:
        """Every layer in one C call where the step allows it (decodes and short prompt chunks; int8
        below the dequantized-GEMM rows), else layer by layer on the same kernels."""
        if (meta.row_tables is not None and meta.row_ctx is not None and (meta.rows_on_kernel or not meta.prefills)
                and (not self.quantized or x.shape[0] < INT8_DEQUANT_ROWS)):
            return self._layers_one_call(x, meta)
        return self._forward_fused_norms(x, meta)

    @torch.inference_mode()
    def nonfinite_layer(self, input_ids: torch.Tensor, meta: AttnMeta) -> int | None:
        """Diagnosis after non-finite logits: the step again, layer by layer on the same backends,
        and the first layer whose output has a non-finite value (-1: the embedding itself; None:
        every layer finite, so the final norm or the lm_head). It writes the step's KV again."""
        x = torch.index_select(self.embed, 0, input_ids)
        if not bool(torch.isfinite(x).all()):
            return -1
        cos = self.cos[meta.positions].unsqueeze(1)
        sin = self.sin_signed[meta.positions].unsqueeze(1)
        eps = self.spec.rms_norm_eps
        for li, lw in enumerate(self.layers):
            x.add_(self._attention(li, lw, rms_norm(x, lw.input_norm, eps), cos, sin, meta))
            h = rms_norm(x, lw.post_norm, eps)
            x.add_(self.linear(self._silu_mul(self.linear(h, lw.gate_up)), lw.down))
            if not bool(torch.isfinite(x).all()):
                return li
        return None

    def _fuses_layers(self) -> bool:
        """Whether steps run on step_layers (the C attention, add+RMSNorm, RoPE/KV, silu*mul and GEMM
        kernels composed; deterministic mode keeps its per-row SDPA attention)."""
        return self._one_call_ok

    def _layer_ptrs(self) -> object:
        """The ctypes array of every layer's weight and KV pointers for step_layers, rebuilt when
        the KV pool is (re)allocated."""
        from zgtool.engine.cpu_kernels import LayerPtrs

        key = self._kv_generation
        if self._ptrs_key == key and self._ptrs is not None:
            return self._ptrs
        ones = self._lm_ones

        def wp(w: object) -> tuple[int, int]:  # (weights, per-channel scales)
            if isinstance(w, Int8Weight):
                return w.q.data_ptr(), w.scale.data_ptr()
            assert isinstance(w, torch.Tensor) and ones is not None
            # the C step reads one scale per output channel with no length to check (issue 26's NaN):
            # the caller checks the table covers this GEMM's outputs
            if ones.numel() < w.shape[0] or not w.is_contiguous() or w.dtype != torch.float32:
                raise RuntimeError(f"step_layers: a [{w.shape[0]}, ...] {w.dtype} weight with a scale table of "
                                   f"{ones.numel()} (needs contiguous fp32 and a scale per output channel)")
            return w.data_ptr(), ones.data_ptr()

        arr = (LayerPtrs * len(self.layers))()
        for i, lw in enumerate(self.layers):
            qkv, qkv_s = wp(lw.qkv)
            o, o_s = wp(lw.o)
            gu, gu_s = wp(lw.gate_up)
            dn, dn_s = wp(lw.down)
            arr[i] = LayerPtrs(lw.input_norm.data_ptr(), lw.post_norm.data_ptr(), qkv, qkv_s,
                               None if lw.qkv_bias is None else lw.qkv_bias.data_ptr(), o, o_s, gu, gu_s, dn, dn_s,
                               self.k_cache[i].data_ptr(), self.v_cache[i].data_ptr())
        self._ptrs, self._ptrs_key = arr, key
        return arr

    def _buf(self, name: str, n: int) -> torch.Tensor:
        """A grow-only fp32 scratch buffer of at least n elements (valid until the next step)."""
        buf = self._scratch.get(name)
        if buf is None or buf.numel() < n:
            buf = self._scratch[name] = torch.empty(max(n, 2 * (0 if buf is None else buf.numel())),
                                                    dtype=torch.float32, device=self.device)
        return buf

    def _layers_one_call(self, x: torch.Tensor, meta: AttnMeta) -> torch.Tensor:
        """A step's layers in one C call (engine/cpu_kernels.py step_layers), decodes and short
        prompt chunks alike (each row attends over its own context): the kernels and order of
        _forward_fused_norms, bit-identical to it."""
        from zgtool.engine.cpu_kernels import library

        out, args = self._step_args(x, meta)
        library().step_layers(*args)
        return out

    def _step_args(self, x: torch.Tensor, meta: AttnMeta) -> tuple[torch.Tensor, tuple[object, ...]]:
        """step_layers' output tensor and arguments: pointers into x, meta, the weights and the
        grow-only scratch buffers (valid until the next step)."""
        assert meta.row_ctx is not None and meta.row_tables is not None
        spec = self.spec
        m, hid = x.shape
        nh, nkv, d, inter = self.num_heads, self.num_kv_heads, self.head_dim, spec.intermediate_size
        tables = meta.row_tables
        width = int(tables.shape[1])
        nt = torch.get_num_threads()
        x = x.contiguous()
        out = torch.empty_like(x)
        h, qkv = self._buf("h", m * hid), self._buf("qkv", m * (nh + 2 * nkv) * d)
        q, att = self._buf("q", m * nh * d), self._buf("att", m * nh * d)
        gu, act, delta = self._buf("gu", m * 2 * inter), self._buf("act", m * inter), self._buf("delta", m * hid)
        scratch = self._buf("attn", max(1, nt * nh // nkv * width * self.block_size))
        return out, (
            self._layer_ptrs(), len(self.layers), int(self.quantized), x.data_ptr(), m, hid, nh, nkv, d, inter,
            spec.rms_norm_eps, self.norm.data_ptr(), out.data_ptr(), self.cos.data_ptr(), self.sin_signed.data_ptr(),
            meta.positions.data_ptr(), meta.slot_mapping.data_ptr(), tables.data_ptr(), width,
            meta.row_ctx.data_ptr(), self.block_size, self.scale, h.data_ptr(), qkv.data_ptr(), q.data_ptr(),
            att.data_ptr(), gu.data_ptr(), act.data_ptr(), delta.data_ptr(), scratch.data_ptr(), nt)

    def _forward_fused_norms(self, x: torch.Tensor, meta: AttnMeta) -> torch.Tensor:
        """forward with each residual add fused into the next RMSNorm (one C pass per row)."""
        from zgtool.engine.cpu_kernels import add_rms_norm

        cos = self.cos[meta.positions].unsqueeze(1)  # [T, 1, D]
        sin = self.sin_signed[meta.positions].unsqueeze(1)
        eps = self.spec.rms_norm_eps
        x = x.contiguous()
        delta: torch.Tensor | None = None
        for li, lw in enumerate(self.layers):
            h = add_rms_norm(x, delta, lw.input_norm, eps)
            h = add_rms_norm(x, self._attention(li, lw, h, cos, sin, meta), lw.post_norm, eps)
            delta = self.linear(self._silu_mul(self.linear(h, lw.gate_up)), lw.down)
        return add_rms_norm(x, delta, self.norm, eps)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head_method.logits(hidden)

    def greedy_tokens(self, hidden: torch.Tensor) -> list[int] | None:
        """Each row's argmax token of logits(hidden), the lm_head GEMM and the argmax in one C call
        (no logits tensor, no torch argmax, no device sync op: ~0.2 ms of a dummy:small decode
        step); None where the lm_head does not run on the C kernels."""
        g = self.lm_head_method.greedy
        if g is None:
            return None
        from zgtool.engine.cpu_kernels import library

        m, hid = hidden.shape
        vocab = int(g.weight.shape[0])
        hidden = hidden.contiguous()
        toks = self._tokens
        if toks.numel() < m:
            toks = self._tokens = torch.empty(2 * m, dtype=torch.long)
        library().lm_head_argmax(hidden.data_ptr(), m, hid, g.weight.data_ptr(), g.scale.data_ptr(), g.int8,
                                 self._buf("logits", m * vocab).data_ptr(), vocab, toks.data_ptr(),
                                 torch.get_num_threads())
        self._argmax_shape = (m, vocab)
        return toks[:m].tolist()

    def nonfinite_rows(self, logits: torch.Tensor) -> list[int]:
        """Rows of logits [M, V] with a NaN or an infinity: one C pass where this model runs on the
        kernels (torch's isfinite over a large vocabulary opens an OpenMP region that competes with
        the kernel pool), torch otherwise (a shape the kernels do not take never calls them)."""
        if self._one_call_ok and logits.device.type == "cpu" and logits.dtype == torch.float32:
            from zgtool.engine.cpu_kernels import nonfinite_rows

            return nonfinite_rows(logits.contiguous())
        ok = torch.isfinite(logits).all(dim=-1)
        return [] if bool(ok.all()) else [int(i) for i in (~ok).nonzero().flatten().tolist()]

    def nonfinite_greedy_rows(self, m: int) -> list[int]:
        """Rows of the last greedy_tokens call whose logits were not all finite (the C argmax
        would have answered token 0 for a NaN row): one C pass over the logits buffer (torch's
        isfinite over SmolLM2's 49152 logits opened an OpenMP region that cost up to ~100 ms a step
        on a loaded 2-core box, beside the kernel pool's spinning workers)."""
        from zgtool.engine.cpu_kernels import nonfinite_rows

        rows, vocab = self._argmax_shape
        return nonfinite_rows(self._scratch["logits"][:rows * vocab].view(rows, vocab))

    def _silu_mul_c(self, gu: torch.Tensor) -> torch.Tensor:
        """gu [T, 2I] (gate | up) -> silu(gate) * up [T, I], one C pass"""
        from zgtool.engine.cpu_kernels import silu_mul

        return silu_mul(gu)

    @staticmethod
    def _silu_mul_torch(gu: torch.Tensor) -> torch.Tensor:
        i = gu.shape[1] // 2
        return F.silu(gu[:, :i]).mul_(gu[:, i:])

    def _rope_kv_c(self, qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, meta: AttnMeta,
                   kc: torch.Tensor, vc: torch.Tensor) -> torch.Tensor:
        """RoPE on q and k, k and v into the pool: one C pass; -> q [T, H, D]"""
        from zgtool.engine.cpu_kernels import rope_kv_write

        return rope_kv_write(qkv, self.num_heads, self.num_kv_heads, self.cos, self.sin_signed, meta.positions,
                             meta.slot_mapping, kc, vc)

    def _rope_kv_torch(self, qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, meta: AttnMeta,
                       kc: torch.Tensor, vc: torch.Tensor) -> torch.Tensor:
        t = qkv.shape[0]
        nh, nkv, d = self.num_heads, self.num_kv_heads, self.head_dim
        qk = self._rope(qkv[:, :(nh + nkv) * d].view(t, nh + nkv, d), cos, sin)  # q and k rotated at once
        q, k = qk[:, :nh], qk[:, nh:]
        kc[meta.slot_mapping] = k
        vc[meta.slot_mapping] = qkv[:, (nh + nkv) * d:].view(t, nkv, d)
        return q

    def _rope(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """x [T, N, D] -> x * cos + rotate_half(x) * sin (sin carries rotate_half's sign)."""
        half = self.head_dim // 2
        flipped = torch.cat((x[..., half:], x[..., :half]), dim=-1)
        return torch.addcmul(x * cos, flipped, sin)

    def _attention(self, li: int, lw: LayerWeights, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                   meta: AttnMeta) -> torch.Tensor:
        qkv = self.linear(h, lw.qkv, lw.qkv_bias)  # [T, (H + 2 KVH) * D]
        kc, vc = self.k_cache[li], self.v_cache[li]
        q = self._rope_kv(qkv, cos, sin, meta, kc, vc)
        out = self.attention.attend(q, kc, vc, meta)  # [T, H, D]
        return self.linear(out.reshape(h.shape[0], -1), lw.o)

    def _gather(self, cache: torch.Tensor, blocks: torch.Tensor, buf: str | None = None) -> torch.Tensor:
        """Whole blocks out of the pool: [slots, KVH, D] viewed as [blocks, bs*KVH*D] rows, so
        index_select copies contiguous block-sized rows (far cheaper than per-slot indexing).
        With `buf`, into a grow-only scratch buffer of that name: a fresh multi-MB tensor per
        layer costs page faults every time (measured: index_select into a reused buffer
        ~2x faster than allocating). The result is only valid until the next gather into buf."""
        width = self.block_size * self.num_kv_heads * self.head_dim
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


class AttentionBackend:
    """One step's attention over the paged KV: q [T, H, D] (KV already written) -> [T, H, D]."""

    name = "?"

    def __init__(self, model: LlamaModel) -> None:
        self.m = model

    def attend(self, q: torch.Tensor, kc: torch.Tensor, vc: torch.Tensor, meta: AttnMeta) -> torch.Tensor:
        raise NotImplementedError


class RowAttention(AttentionBackend):
    """Deterministic mode: each query row alone over exactly its own context (torch SDPA)."""

    name = "torch-sdpa per row"

    def attend(self, q: torch.Tensor, kc: torch.Tensor, vc: torch.Tensor, meta: AttnMeta) -> torch.Tensor:
        out = torch.empty_like(q)
        self.m._attend_rows(q, kc, vc, meta, out)
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
            kk = m._context(kc, p.blocks, ctx)  # [1, KVH, ctx, D]
            vv = m._context(vc, p.blocks, ctx)
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
        kk = m._gather(kc, meta.decode_blocks, "k").view(b, -1, nkv, d).transpose(1, 2)  # [B, KVH, L, D]
        vv = m._gather(vc, meta.decode_blocks, "v").view(b, -1, nkv, d).transpose(1, 2)
        if meta.decode_mask is None and meta.decode_ctx is not None:  # once per step, shared by the layers
            span = torch.arange(meta.decode_blocks.shape[0] // b * m.block_size, device=qd.device)
            meta.decode_mask = (span[None, :] < meta.decode_ctx[:, None])[:, None, None, :]
        mask = meta.decode_mask
        if b == 1:
            ctx = meta.decode_lens[0]
            kk, vv, mask = kk[:, :, :ctx], vv[:, :, :ctx], None
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

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
import os
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from zgtool.engine.attention import (
    PREFILL_KERNEL_WORK,
    AttentionBackend,
    AttnMeta,
    PagedKernelAttention,
    PrefillMeta,
    RowAttention,
    SdpaAttention,
    TritonPagedAttention,
    build_attn_meta,
    triton_available,
)
from zgtool.engine.backends import (
    DET_TILE,
    Bf16KernelLinear,
    Bf16KernelLmHead,
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
from zgtool.engine.cpu_forward import CpuStep
from zgtool.engine.cpu_kernels import W_BF16, W_F32, W_INT8, W_INT8A8
from zgtool.engine.presets import ModelSpec
from zgtool.engine.quant import INT8_ACTIVATIONS_ENV, WEIGHT_INT8, Int8Weight, quantize_linear

# AttnMeta, build_attn_meta and PREFILL_KERNEL_WORK live in engine/attention.py (re-exported for callers)
__all__ = ["DET_TILE", "PREFILL_KERNEL_WORK", "AttnMeta", "LlamaModel", "PrefillMeta", "build_attn_meta"]
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


def rope_tables(spec: ModelSpec, device: torch.device, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """cos [P, D] and the signed sin table: rotate_half(x) * sin == flip_halves(x) * (-sin_lo, +sin_hi),
    one table, no neg/cat per layer."""
    inv = rope_inv_freq(spec)
    pos = torch.arange(spec.max_position_embeddings, dtype=torch.float32)
    freqs = torch.outer(pos, inv)
    emb = torch.cat((freqs, freqs), dim=-1)
    cos = emb.cos().to(device=device, dtype=dtype)
    sin = emb.sin()
    half = sin.shape[-1] // 2
    return cos, torch.cat((-sin[:, :half], sin[:, half:]), dim=-1).to(device=device, dtype=dtype)


class LlamaModel:
    """Holds the weights and a paged KV pool; `forward` computes one step's hidden states."""

    def __init__(self, spec: ModelSpec, weights: dict[str, torch.Tensor], device: torch.device,
                 dtype: torch.dtype, deterministic: bool = False) -> None:
        self.spec = spec
        self.device = device
        # int8: the projections and lm_head are quantized; everything else computes in fp32
        self.quantized = dtype == WEIGHT_INT8
        # opt-in: the int8 projections' activations quantised per row too (engine/quant.py)
        self.int8_activations = self.quantized and os.environ.get(INT8_ACTIVATIONS_ENV, "") not in ("", "0")
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
        # bf16 on CPU: bf16 projections and lm_head on the C bf16 GEMMs, everything else (activations,
        # norms, RoPE, attention, KV, the embedding lookup) in fp32 -- half fp32's bytes per decoded
        # token. Without those kernels the whole model runs in bf16 on torch (slower than fp32 there).
        self.bf16_weights = False
        if dtype == torch.bfloat16 and device.type == "cpu":
            why = self.plan.library_off or self.plan.gemm_off or self.plan.norm_off
            if why is None:
                self.bf16_weights, dtype = True, torch.float32
            else:
                self.plan = KernelPlan.off(f"dtype bfloat16 without the bf16 GEMM kernels ({why})")
        self.dtype = dtype
        # f32_gemm's per-channel scale: ones, as long as the widest output of any GEMM it scales (the
        # vocabulary, qkv, gate_up = 2 x intermediate, o/down = hidden). The C step reads N scales per
        # GEMM with no length to check against: a short table was read past its end, which gave NaN
        # logits on every checkpoint whose vocabulary is smaller than 2 x intermediate (issue 26).
        widest = max(spec.vocab_size, (self.num_heads + 2 * self.num_kv_heads) * self.head_dim,
                     2 * spec.intermediate_size, spec.hidden_size)
        on_f32_kernels = not self.quantized and (self.plan.norm_off is None or self.plan.gemm_off is None)  # bf16 too
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
        self._lm_head_bf16 = self.lm_head.to(torch.bfloat16).contiguous() if self.bf16_weights else None
        if self._lm_head_bf16 is not None and not tied:
            self.lm_head = self._lm_head_bf16  # the fp32 copy is never read: do not hold it
        self.layers: list[LayerWeights] = [self._layer(i, weights, w, wt) for i in range(spec.num_layers)]
        # the C-kernel step glue: pointer tables, step_layers' arguments, scratch buffers, greedy argmax
        self.cpu = CpuStep(self, W_INT8A8 if self.int8_activations else W_INT8 if self.quantized
                           else W_BF16 if self.bf16_weights else W_F32)
        self._kv_generation = 0
        # what is switched on, from the plan (the A/B benches and kernel tests may switch a piece off
        # through the properties below, which choose the backends again)
        self._use = {"gemm": self.plan.gemm_off is None, "attention": self.plan.attention_off is None,
                     "norm": self.plan.norm_off is None, "glue": self.plan.glue_off is None,
                     "lm_head": self.plan.norm_off is None and not self.quantized, "fused": True}
        # CUDA: the step's layers on the Triton kernels (engine/gpu_forward.py), None or why not
        self.triton_off = ("deterministic mode" if deterministic else triton_available() if device.type == "cuda"
                           else f"device {device.type}")
        self._use["triton"] = self.triton_off is None
        self._choose_backends()
        self.cos, self.sin_signed = rope_tables(spec, device, dtype)
        self.k_cache: list[torch.Tensor] = []
        self.v_cache: list[torch.Tensor] = []
        self.block_size = 0

    def _layer(self, i: int, weights: dict[str, torch.Tensor], w: Callable[[str], torch.Tensor],
               wt: Callable[..., torch.Tensor]) -> LayerWeights:
        """Layer i's weights, popped from `weights`: norms by w, projections in the layout's form by wt."""
        p = f"model.layers.{i}."
        a, m = p + "self_attn.", p + "mlp."
        kv_dim = self.num_kv_heads * self.head_dim
        biases = [weights.pop(a + f"{n}_proj.bias", None) for n in "qkv"]
        qkv_bias = None
        if any(b is not None for b in biases):
            sizes = (self.num_heads * self.head_dim, kv_dim, kv_dim)
            qkv_bias = torch.cat([b if b is not None else torch.zeros(n) for b, n in zip(biases, sizes, strict=True)])
            qkv_bias = qkv_bias.to(device=self.device, dtype=self.dtype).contiguous()
        return LayerWeights(
            input_norm=w(p + "input_layernorm.weight"),
            qkv=wt(a + "q_proj.weight", a + "k_proj.weight", a + "v_proj.weight"),
            qkv_bias=qkv_bias,
            o=wt(a + "o_proj.weight"),
            post_norm=w(p + "post_attention_layernorm.weight"),
            gate_up=wt(m + "gate_proj.weight", m + "up_proj.weight"),
            down=wt(m + "down_proj.weight"),
        )

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
            return Int8Linear(None if self.deterministic else INT8_DEQUANT_ROWS, self._dequantized,
                              self.int8_activations)
        if self.bf16_weights and self._lm_ones is not None:
            return Bf16KernelLinear(self._lm_ones)
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
        if isinstance(lin, F32KernelLinear | Bf16KernelLinear) and not use["gemm"]:
            lin = TorchLinear()  # the same [out, in] weights on MKL's F.linear
        self.linear_method: LinearMethod = TiledLinear(lin) if det else lin
        self.lm_head_method: LmHead
        if self._lm_head_q is not None:
            self.lm_head_method = Int8LmHead(self._lm_head_q)
        elif use["lm_head"] and self._lm_head_bf16 is not None and self._lm_ones is not None:
            self.lm_head_method = Bf16KernelLmHead(self._lm_head_bf16, self._lm_ones)
        elif use["lm_head"] and self._lm_ones is not None:
            self.lm_head_method = F32KernelLmHead(self.lm_head, self._lm_ones)
        else:
            self.lm_head_method = TorchLmHead(self.lm_head, det)
        self.attention: AttentionBackend = (RowAttention(self) if det else PagedKernelAttention(self)
                                            if use["attention"] else SdpaAttention(self))
        self._rope_kv = self._rope_kv_c if use["glue"] else self._rope_kv_torch
        self._silu_mul = self._silu_mul_c if use["glue"] else self._silu_mul_torch
        self._one_call_ok = (not det and use["fused"] and use["attention"] and use["norm"] and use["glue"]
                             and (self.quantized or isinstance(lin, F32KernelLinear | Bf16KernelLinear)))
        self._layers_fn = (self._layers_c_step if self._one_call_ok else self._forward_fused_norms
                           if use["norm"] else self._forward_torch)
        if use["triton"]:  # the compute path is an object chosen here, once: forward() just calls it
            from zgtool.engine.gpu_forward import TritonLayers

            self.attention = TritonPagedAttention(self)
            self._layers_fn = TritonLayers(self)
            self._one_call_ok = False

    @property
    def backend_name(self) -> str:
        """How this model computes, for banners and results: "c-kernels" (a step's layers in one C
        call), else "torch: <the first reason a kernel is off>" (naming the pieces still on C)."""
        if self._one_call_ok:
            return "c-kernels"
        if self._use["triton"]:
            return "triton"
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
                   "fused": None, "triton": None if self.triton_off in (None, "device cpu") else self.triton_off}[piece]
        self._use[piece] = bool(on) and allowed is None
        self._choose_backends()

    # A/B switches for benches and kernel tests (bench/engine_decode_ab.py): switching a piece off
    # (or back on where the plan allows it) chooses the backends again.
    attn_kernel = property(lambda self: self._use["attention"], lambda self, on: self._switch("attention", on))
    fast_norm = property(lambda self: self._use["norm"], lambda self, on: self._switch("norm", on))
    fast_glue = property(lambda self: self._use["glue"], lambda self, on: self._switch("glue", on))
    fast_lm_head = property(lambda self: self._use["lm_head"], lambda self, on: self._switch("lm_head", on))
    fused_layers = property(lambda self: self._use["fused"], lambda self, on: self._switch("fused", on))
    # the CUDA path's Triton kernels; on CPU only in Triton's interpreter (tests/engine/test_cuda_runner.py)
    triton_layers = property(lambda self: self._use["triton"], lambda self, on: self._switch("triton", on))
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
        """step_layers' table of every layer's weight and KV pointers (engine/cpu_forward.py)."""
        return self.cpu.layer_ptrs()

    def _buf(self, name: str, n: int) -> torch.Tensor:
        """A grow-only fp32 scratch buffer of at least n elements (valid until the next step)."""
        return self.cpu.buf(name, n)

    def _layers_one_call(self, x: torch.Tensor, meta: AttnMeta) -> torch.Tensor:
        """A step's layers in one C call (engine/cpu_forward.py): the kernels and order of
        _forward_fused_norms, bit-identical to it."""
        return self.cpu.layers_one_call(x, meta)

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
        return None if g is None else self.cpu.greedy_tokens(hidden, g)

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
        return self.cpu.nonfinite_greedy_rows()

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

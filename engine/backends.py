"""LlamaModel's compute backends, chosen once at load as objects (issue 26; vLLM's linear-method
and attention-backend objects): the forward never branches on what the machine supports.

- `KernelPlan`: which C kernels (engine/cpu_kernels.py) this model can use on this machine, each
  with the reason when not (no compiler, ZGTOOL_NO_KERNELS, a CUDA device, bf16, a shape the
  kernels do not handle, the ISA variant loaded: every kernel needs hidden/intermediate sizes that are multiples of 8,
  the attention kernel a head_dim that is one too). A shape the kernels do not support takes the
  torch path, and the plan names why (`LlamaModel.backend_name`).
- linear methods (one projection, x [n, in] -> [n, out]): torch F.linear on [out, in], torch
  mm/addmm on [in, out] (fp32 without the kernels: MKL is faster on that layout), the C fp32 GEMM,
  the C bf16 GEMM (bf16 weights, fp32 activations), the C int8 GEMM; deterministic mode wraps any of them in fixed 32-row tiles.
- lm heads: the same choice for the output projection, plus whether the lm_head + argmax run in
  one C call (greedy decoding).
- attention backends live in engine/model.py beside the paged-KV helpers they use.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from zgtool.engine.quant import Int8Weight, int8_linear, quantize_linear

DET_TILE = 32


@dataclass(frozen=True)
class KernelPlan:
    """Which C kernels a model uses, decided once at load. Each `*_off` is None when that kernel is
    used, else the reason it is not."""

    library_off: str | None   # the library itself: no compiler, ZGTOOL_NO_KERNELS, CUDA, fp16
    gemm_off: str | None      # fp32/int8 projections on the C GEMMs
    attention_off: str | None  # paged attention over the KV in place
    norm_off: str | None      # residual add + RMSNorm in one pass (and the fp32 lm_head GEMM)
    glue_off: str | None      # RoPE + KV write, silu(gate) * up
    isa: str | None = None    # the kernels' ISA variant (engine/cpu_kernels.py VARIANTS) when loaded

    @staticmethod
    def off(reason: str) -> KernelPlan:
        """Every kernel off for one reason."""
        return KernelPlan(reason, reason, reason, reason, reason)

    @staticmethod
    def choose(hidden: int, intermediate: int, head_dim: int, device: torch.device, dtype: torch.dtype,
               quantized: bool) -> KernelPlan:
        off = isa = None
        if device.type != "cpu":
            off = f"{device.type} device (the C kernels are CPU-only)"
        elif dtype not in (torch.float32, torch.bfloat16):
            off = f"dtype {str(dtype).removeprefix('torch.')} (the C kernels take fp32, bf16 or int8 weights)"
        else:
            from zgtool.engine.cpu_kernels import KernelsUnavailable, library

            try:
                isa = library().kernel_isa().decode()
            except KernelsUnavailable as exc:
                off = str(exc).splitlines()[0] if str(exc) else "kernels unavailable"

        def need(*checks: tuple[str, int, int]) -> str | None:
            if off is not None:
                return off
            for name, n, mult in checks:
                if n % mult:
                    return f"{name} {n} is not a multiple of {mult}"
            return None

        norm_off = need(("hidden size", hidden, 8))
        return KernelPlan(
            library_off=off,
            gemm_off=need(("hidden size", hidden, 8), ("intermediate size", intermediate, 8)),
            attention_off=need(("head_dim", head_dim, 8)),
            norm_off=norm_off,
            glue_off=norm_off or need(("intermediate size", intermediate, 8), ("head_dim", head_dim, 2)),
            isa=isa,
        )


# -- linear methods ---------------------------------------------------------------------------

class LinearMethod:
    """One projection's layout (`prepare`, once per weight at load) and product (`apply`)."""

    name = "?"

    def prepare(self, m: torch.Tensor) -> torch.Tensor:  # m: [out, in] in the model's dtype
        return m.contiguous()

    def apply(self, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None = None) -> torch.Tensor:
        raise NotImplementedError


class TorchLinear(LinearMethod):
    """F.linear on [out, in] (bf16/fp16, CUDA, and fp32 or bf16 [out, in] weights with the GEMM kernel
    switched off: bf16 weights under fp32 activations compute in bf16, as a bf16 model would)."""

    name = "torch"

    def apply(self, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None = None) -> torch.Tensor:
        if w.dtype != x.dtype:
            return F.linear(x.to(w.dtype), w, None if b is None else b.to(w.dtype)).to(x.dtype)
        return F.linear(x, w, b)


class TransposedTorchLinear(LinearMethod):
    """fp32 on CPU without the C kernels: weights stored [in, out] and applied with mm/addmm (MKL's
    GEMV/small-M GEMM ran 15-50% faster on that layout than F.linear's [out, in])."""

    name = "torch-mm"

    def prepare(self, m: torch.Tensor) -> torch.Tensor:
        return m.t().contiguous()

    def apply(self, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None = None) -> torch.Tensor:
        return torch.mm(x, w) if b is None else torch.addmm(b, x, w)


class F32KernelLinear(LinearMethod):
    """The C fp32 GEMM on [out, in] (output channels split over the pool's threads); `ones` is its
    per-channel scale table, as long as the widest output of any projection."""

    name = "c-f32-gemm"

    def __init__(self, ones: torch.Tensor) -> None:
        self.ones = ones

    def apply(self, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None = None) -> torch.Tensor:
        from zgtool.engine.cpu_kernels import f32_gemm

        return f32_gemm(x, w, self.ones, b)


class Bf16KernelLinear(LinearMethod):
    """bf16 weights [out, in] on the C bf16 GEMM, fp32 activations and accumulation (half fp32's
    bytes per token: decode reads every weight once, so it is memory-bound); `ones` as for fp32."""

    name = "c-bf16-gemm"

    def __init__(self, ones: torch.Tensor) -> None:
        self.ones = ones

    def prepare(self, m: torch.Tensor) -> torch.Tensor:
        return m.to(torch.bfloat16).contiguous()

    def apply(self, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None = None) -> torch.Tensor:
        from zgtool.engine.cpu_kernels import bf16_gemm

        return bf16_gemm(x, w, self.ones, b)


class Int8Linear(LinearMethod):
    """Per-channel int8 weights (engine/quant.py) on the C int8 GEMM; from `dequant_rows` rows (None:
    never) the weight is dequantized into a reused fp32 buffer and run by MKL instead."""

    name = "c-int8-gemm"

    def __init__(self, dequant_rows: int | None, dequantized: Callable[[Int8Weight], torch.Tensor],
                 quantise_activations: bool = False) -> None:
        self.dequant_rows = dequant_rows
        self.dequantized = dequantized
        self.quantise_activations = quantise_activations  # engine/quant.py INT8_ACTIVATIONS_ENV
        if quantise_activations:
            self.name = "c-int8-w8a8-gemm"

    def prepare(self, m: torch.Tensor) -> torch.Tensor:
        return quantize_linear(m)  # type: ignore[return-value]  # an Int8Weight, applied by apply()

    def apply(self, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None = None) -> torch.Tensor:
        if self.dequant_rows is not None and x.shape[0] >= self.dequant_rows:
            return F.linear(x, self.dequantized(w), b)  # type: ignore[arg-type]
        return int8_linear(x, w, b, self.quantise_activations)  # type: ignore[arg-type]


class TiledLinear(LinearMethod):
    """Deterministic (batch-invariant) mode: any method on fixed 32-row tiles, the last one
    zero-padded, so each row meets the same GEMM shape whatever shares its batch."""

    def __init__(self, inner: LinearMethod) -> None:
        self.inner = inner
        self.name = f"{inner.name} in {DET_TILE}-row tiles"

    def prepare(self, m: torch.Tensor) -> torch.Tensor:
        return self.inner.prepare(m)

    def apply(self, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None = None) -> torch.Tensor:
        return tiled(x, lambda t: self.inner.apply(t, w, b))


def tiled(x: torch.Tensor, fn: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
    n = x.shape[0]
    pad = (-n) % DET_TILE
    if pad:
        x = torch.cat([x, x.new_zeros(pad, x.shape[1])])
    return torch.cat([fn(t) for t in x.split(DET_TILE)])[:n]


# -- lm heads ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class GreedyArgs:
    """What the C lm_head + argmax call reads: weights [V, hidden], per-row scales, and the weight
    element (engine/cpu_kernels.py W_F32 | W_BF16 | W_INT8)."""

    weight: torch.Tensor
    scale: torch.Tensor
    wtype: int


class LmHead:
    name = "?"
    greedy: GreedyArgs | None = None  # set where the lm_head + argmax can run in one C call

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError


class Int8LmHead(LmHead):
    """int8 lm_head (SmolLM2's 49152 x 576: 1.3x faster than fp32 at 1 row, 3x at 16); rows never mix
    in the int8 kernel, so it is batch-invariant as is."""

    name = "c-int8-gemm"

    def __init__(self, w: Int8Weight) -> None:
        self.w = w
        from zgtool.engine.cpu_kernels import W_INT8

        self.greedy = GreedyArgs(w.q, w.scale, W_INT8)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return int8_linear(hidden, self.w)


class F32KernelLmHead(LmHead):
    """fp32 lm_head on the C GEMM (SmolLM2, 16 rows: ~30 ms vs MKL's ~50); rows never mix."""

    name = "c-f32-gemm"

    def __init__(self, w: torch.Tensor, ones: torch.Tensor) -> None:
        from zgtool.engine.cpu_kernels import W_F32

        self.w, self.ones = w, ones
        self.greedy = GreedyArgs(w, ones, W_F32)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        from zgtool.engine.cpu_kernels import f32_gemm

        return f32_gemm(hidden, self.w, self.ones)


class Bf16KernelLmHead(LmHead):
    """bf16 lm_head [V, hidden] on the C bf16 GEMM (fp32 logits); rows never mix."""

    name = "c-bf16-gemm"

    def __init__(self, w: torch.Tensor, ones: torch.Tensor) -> None:
        from zgtool.engine.cpu_kernels import W_BF16

        self.w, self.ones = w, ones
        self.greedy = GreedyArgs(w, ones, W_BF16)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        from zgtool.engine.cpu_kernels import bf16_gemm

        return bf16_gemm(hidden, self.w, self.ones)


class TorchLmHead(LmHead):
    """F.linear on [V, hidden] in every dtype (for SmolLM2 at 16 rows MKL took 34 ms on it vs 46
    transposed); deterministic mode in fixed 32-row tiles."""

    def __init__(self, w: torch.Tensor, deterministic: bool) -> None:
        self.w, self.deterministic = w, deterministic
        self.name = f"torch in {DET_TILE}-row tiles" if deterministic else "torch"

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        hidden = hidden.to(self.w.dtype)  # bf16 weights under fp32 activations (the kernels switched off)
        if not self.deterministic:
            return F.linear(hidden, self.w).float()
        return tiled(hidden, lambda t: F.linear(t, self.w)).float()

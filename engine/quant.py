"""`--dtype int8` on CPU: weight-only int8. Every projection and the lm_head is stored as int8
with one fp32 scale per output channel (symmetric, round-to-nearest, max-abs / 127) and applied
by an AVX2 kernel (engine/cpu_kernels.py: w8_gemm) that converts the weights to fp32 in
registers. Activations, norms, RoPE, attention, the KV cache and the embedding lookup stay fp32.
Lossy (llama.cpp's Q4_1 is too): measure greedy agreement (bench/engine_int8.py), never expect
bit-equality with fp32. Rows never mix (each output is one fixed sequence of FMAs over its own
row), so the path stays batch-invariant and deterministic mode works with it.

Kernels measured and rejected (2-core AVX2 box, 1 thread, SmolLM2 shapes, us per call):
                         fp32 mm   fbgemm dynamic int8   aten._weight_int8pack_mm
  batch 1, 960x576          85          79-121                   911
  batch 16, 1536x576      487-745       273-350                21207
  batch 16, 49152x576     52-66k        6.7-13k                 759k
  - aten._weight_int8pack_mm (weight-only, the natural choice) has no fast AVX2 path in this
    torch: 10-40x slower than fp32.
  - fbgemm's dynamic int8 (quantized::linear_dynamic) is fast but quantizes the activations
    per call with one scale for all rows: on SmolLM2-135M teacher-forced greedy top-1 agreement
    with fp32 fell to 44% (qkv kept fp32: 69%; the weights alone simulated in int8: 97%), and
    free-running answers degenerated ("1. 1. 2. 2. ..."); not batch-invariant either.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

WEIGHT_INT8 = torch.int8  # the torch dtype that asks load_model / LlamaModel for this path


@dataclass(frozen=True)
class Int8Weight:
    """A [out, in] projection as int8 q [out, in] and fp32 scale [out]: w ~= q * scale[:, None]."""

    q: torch.Tensor
    scale: torch.Tensor

    @property
    def shape(self) -> torch.Size:
        return self.q.shape

    def dequantize(self) -> torch.Tensor:
        return self.q.float() * self.scale[:, None]


def quantize_linear(w: torch.Tensor) -> Int8Weight:
    """w [out, in] float -> Int8Weight (per-output-channel symmetric scales). The kernel needs
    `in` to be a multiple of 8 (every supported model's hidden/intermediate sizes are)."""
    from zgtool.engine.cpu_kernels import KernelsUnavailable, library
    from zgtool.engine.errors import ModelLoadError

    try:
        library()  # build/load the kernels now: a model that cannot run fails at load, not mid-request
    except KernelsUnavailable as exc:
        raise ModelLoadError(f"dtype int8: {exc}") from exc
    w = w.float()
    if w.shape[1] % 8:
        raise ModelLoadError(f"dtype int8 needs input sizes divisible by 8, got a {tuple(w.shape)} projection")
    scale = (w.abs().amax(dim=1) / 127.0).clamp_min(1e-12)
    q = torch.round(w / scale[:, None]).clamp_(-127, 127).to(torch.int8).contiguous()
    return Int8Weight(q, scale.contiguous())


# ZGTOOL_INT8_ACTIVATIONS=1 with --dtype int8: the activations entering each projection are
# quantised per row to int8 too (w8a8_gemm: vpdpbusd where the kernels' variant has AVX512-VNNI,
# K % 64 == 0), the lm_head stays weight-only. Opt-in and lossier than weight-only int8.
# SmolLM2's 49152 x 576 lm_head shape, avx512bf16, 2 threads, a loaded box, ms, median of 3
# (weight-only / quantised activations): 1 row 16.6 / 16.0, 16 rows 64.2 / 43.9, 64 rows 226 / 129;
# bench/cpu_roofline.py's c=1 decode had it behind weight-only int8 before the weight sums were
# hoisted out of the row blocks (12.7 vs 22.6 tok/s), so it stays off by default until a c=16
# serving benchmark says otherwise.
INT8_ACTIVATIONS_ENV = "ZGTOOL_INT8_ACTIVATIONS"


def int8_linear(x: torch.Tensor, w: Int8Weight, bias: torch.Tensor | None = None,
                quantise_activations: bool = False) -> torch.Tensor:
    """x [n, in] fp32 -> [n, out] fp32 (+ bias); with quantise_activations, x is quantised per row
    to int8 on the fly (w8a8_gemm)."""
    from zgtool.engine.cpu_kernels import w8_gemm, w8a8_gemm

    return (w8a8_gemm if quantise_activations else w8_gemm)(x, w.q, w.scale, bias)

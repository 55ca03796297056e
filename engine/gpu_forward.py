"""The CUDA compute path (issue 35): a step's layers on the Triton kernels (engine/triton_kernels.py)
beside cuBLAS GEMMs: RMSNorm fused with the residual add, RoPE fused with the KV write, SiLU with
the gate-up product, decodes on
the paged decode kernel (engine/attention.py TritonPagedAttention), prompt chunks on flash SDPA.

Chosen once at load by LlamaModel (engine/model.py) where the device is CUDA and triton imports;
every value it reads is on the device, so engine/cuda_runner.py captures a decode step of it in a
CUDA graph. On CPU it runs in Triton's interpreter (tests/engine/test_cuda_runner.py checks it
against the torch path there).
"""

from __future__ import annotations

from typing import Any

import torch

from zgtool.engine.attention import AttnMeta


class TritonLayers:
    """x [T, hidden] (the embedded tokens; updated in place as the residual stream) -> the final
    normed hidden states [T, hidden], KV written into the pool."""

    name = "triton"

    def __init__(self, model: Any) -> None:  # engine/model.py LlamaModel (not imported: no cycle)
        self.m = model

    def __call__(self, x: torch.Tensor, meta: AttnMeta) -> torch.Tensor:
        from zgtool.engine.triton_kernels import add_rms_norm, rope_kv_write, silu_mul

        m = self.m
        eps = m.spec.rms_norm_eps
        t = x.shape[0]
        x = x.contiguous()
        delta: torch.Tensor | None = None
        for li, lw in enumerate(m.layers):
            h = add_rms_norm(x, delta, lw.input_norm, eps)
            qkv = m.linear(h, lw.qkv, lw.qkv_bias)
            kc, vc = m.k_cache[li], m.v_cache[li]
            q = rope_kv_write(qkv, m.num_heads, m.num_kv_heads, m.cos, m.sin_signed, meta.positions,
                              meta.slot_mapping, kc, vc)
            att = m.attention.attend(q, kc, vc, meta)
            h = add_rms_norm(x, m.linear(att.reshape(t, -1), lw.o), lw.post_norm, eps)
            delta = m.linear(silu_mul(m.linear(h, lw.gate_up)), lw.down)
        return add_rms_norm(x, delta, m.norm, eps)

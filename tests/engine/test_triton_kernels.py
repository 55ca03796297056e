"""The Triton kernels of the CUDA step (engine/triton_kernels.py) against torch references, on
shapes the presets do not use: head_dim 16/64/80/128, GQA groups 1-8, contexts across block
boundaries, odd batch sizes, block sizes 8/16/32. Without CUDA they run in Triton's interpreter
(TRITON_INTERPRET=1) on CPU tensors; the `test` extra installs triton (scripts/setup.sh)."""

from __future__ import annotations

import os

import pytest
import torch
import torch.nn.functional as F

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # read when the kernels are decorated (first import)
pytest.importorskip("triton", reason="triton is not installed (pip install -e '.[test]' installs it)")

from zgtool.engine import triton_kernels as tk  # noqa: E402
from zgtool.engine.model import rms_norm  # noqa: E402

DEV = torch.device("cuda" if torch.cuda.is_available() else "cpu")


def _pool(num_blocks: int, bs: int, kvh: int, d: int, dtype: torch.dtype, gen: torch.Generator):
    shape = (num_blocks * bs, kvh, d)
    return (torch.randn(shape, generator=gen).to(dtype).to(DEV), torch.randn(shape, generator=gen).to(dtype).to(DEV))


def _reference(q, kc, vc, tables, ctx, bs, scale):
    """Each row alone: its first ctx positions gathered slot by slot, SDPA in fp32."""
    out = []
    for i in range(q.shape[0]):
        n = int(ctx[i])
        slots = torch.tensor([int(tables[i, p // bs]) * bs + p % bs for p in range(n)])
        k = kc.cpu().float()[slots].transpose(0, 1)[None]  # [1, KVH, n, D]
        v = vc.cpu().float()[slots].transpose(0, 1)[None]
        out.append(F.scaled_dot_product_attention(q[i].cpu().float()[None, :, None], k, v, scale=scale,
                                                  enable_gqa=True)[0, :, 0])
    return torch.stack(out)


# (batch, query heads, kv heads, head_dim, block size, contexts): odd batches, groups 1-8, contexts
# across block edges (1, bs-1, bs, bs+1, several blocks) and past one 64-position kernel tile
GRID = [
    (1, 4, 4, 16, 16, [1]),
    (3, 8, 1, 64, 16, [15, 16, 17]),
    (5, 6, 2, 80, 8, [1, 8, 9, 23, 70]),
    (2, 16, 2, 128, 32, [33, 130]),
    (7, 12, 3, 64, 16, [2, 31, 32, 33, 64, 65, 100]),
]


@pytest.mark.parametrize(("batch", "heads", "kv_heads", "head_dim", "bs", "ctx"), GRID)
def test_paged_decode_matches_sdpa_over_each_rows_own_context(batch, heads, kv_heads, head_dim, bs, ctx):
    gen = torch.Generator().manual_seed(batch * 131 + head_dim)
    width = max(-(-c // bs) for c in ctx) + 1
    num_blocks = batch * width + 3
    kc, vc = _pool(num_blocks, bs, kv_heads, head_dim, torch.float32, gen)
    perm = torch.randperm(num_blocks, generator=gen)  # blocks scattered over the pool, rows padded with junk ids
    tables = perm[: batch * width].view(batch, width).to(DEV)
    q = torch.randn(batch, heads, head_dim, generator=gen).to(DEV)
    lens = torch.tensor(ctx, device=DEV)
    scale = head_dim ** -0.5
    got = tk.paged_decode_attention(q, kc, vc, tables, lens, bs, scale)
    torch.testing.assert_close(got.cpu(), _reference(q, kc, vc, tables, lens, bs, scale), rtol=1e-5, atol=1e-5)


def test_paged_decode_reads_strided_q_and_bf16_pools():
    gen = torch.Generator().manual_seed(7)
    bs, kvh, heads, d = 16, 2, 8, 64
    kc, vc = _pool(12, bs, kvh, d, torch.bfloat16, gen)
    qkv = torch.randn(3, (heads + 2 * kvh) * d, generator=gen).to(torch.bfloat16).to(DEV)
    q = qkv[:, : heads * d].view(3, heads, d)  # a view into the fused projection: row stride != H * D
    tables = torch.arange(12, device=DEV).view(3, 4)
    lens = torch.tensor([5, 40, 64], device=DEV)
    got = tk.paged_decode_attention(q, kc, vc, tables, lens, bs, d ** -0.5)
    ref = _reference(q, kc, vc, tables, lens, bs, d ** -0.5)
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got.float().cpu(), ref, rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize(("rows", "cols", "dtype"), [(1, 64, torch.float32), (5, 80, torch.float32),
                                                      (3, 576, torch.bfloat16)])
def test_add_rms_norm_equals_the_residual_add_then_rms_norm(rows, cols, dtype):
    gen = torch.Generator().manual_seed(rows * cols)
    x = torch.randn(rows, cols, generator=gen).to(dtype).to(DEV)
    delta = torch.randn(rows, cols, generator=gen).to(dtype).to(DEV)
    w = (1 + 0.1 * torch.randn(cols, generator=gen)).to(dtype).to(DEV)
    ref_x = (x.cpu() + delta.cpu())
    ref_h = rms_norm(ref_x, w.cpu(), 1e-5)
    got_x = x.clone()
    got_h = tk.add_rms_norm(got_x, delta, w, 1e-5)
    tol = {"rtol": 1e-5, "atol": 1e-5} if dtype == torch.float32 else {"rtol": 1.6e-2, "atol": 1.6e-2}
    # the add rounds once, as torch's does; Triton's interpreter casts to bf16 by truncation (the GPU
    # rounds to nearest even), so there it may be one bf16 ulp off
    exact = dtype == torch.float32 or DEV.type == "cuda"
    torch.testing.assert_close(got_x.cpu(), ref_x, rtol=0 if exact else 2 ** -7, atol=0)
    torch.testing.assert_close(got_h.cpu(), ref_h, **tol)
    first = tk.add_rms_norm(x.clone(), None, w, 1e-5)  # no delta: the first layer's norm
    torch.testing.assert_close(first.cpu(), rms_norm(x.cpu(), w.cpu(), 1e-5), **tol)


@pytest.mark.parametrize(("tokens", "heads", "kv_heads", "head_dim"), [(1, 4, 4, 16), (3, 8, 2, 64),
                                                                       (5, 6, 3, 80), (2, 8, 1, 128)])
def test_rope_kv_write_rotates_q_and_k_and_writes_the_pool_at_each_slot(tokens, heads, kv_heads, head_dim):
    gen = torch.Generator().manual_seed(tokens * head_dim + heads)
    pos_max, slots_n = 300, 64
    inv = 1.0 / (10000 ** (torch.arange(0, head_dim, 2).float() / head_dim))
    emb = torch.outer(torch.arange(pos_max).float(), inv).repeat(1, 2)
    half = head_dim // 2
    cos, sin = emb.cos(), emb.sin()
    sin_signed = torch.cat((-sin[:, :half], sin[:, half:]), dim=-1)
    qkv = torch.randn(tokens, (heads + 2 * kv_heads) * head_dim, generator=gen)
    positions = torch.randperm(pos_max, generator=gen)[:tokens]
    slots = torch.randperm(slots_n, generator=gen)[:tokens]
    kc = torch.zeros(slots_n, kv_heads, head_dim)
    vc = torch.zeros_like(kc)
    kc_dev, vc_dev = kc.to(DEV), vc.to(DEV)
    q = tk.rope_kv_write(qkv.to(DEV), heads, kv_heads, cos.to(DEV), sin_signed.to(DEV), positions.to(DEV),
                         slots.to(DEV), kc_dev, vc_dev)

    def rot(x):  # transformers' apply_rotary_pos_emb: x * cos + rotate_half(x) * sin
        c, s = cos[positions][:, None], sin[positions][:, None]
        return x * c + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * s

    hd = heads * head_dim
    ref_q = rot(qkv[:, :hd].view(tokens, heads, head_dim))
    ref_k = rot(qkv[:, hd:hd + kv_heads * head_dim].view(tokens, kv_heads, head_dim))
    kc[slots], vc[slots] = ref_k, qkv[:, hd + kv_heads * head_dim:].view(tokens, kv_heads, head_dim)
    torch.testing.assert_close(q.cpu(), ref_q, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(kc_dev.cpu(), kc, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(vc_dev.cpu(), vc, rtol=0, atol=0)


@pytest.mark.parametrize(("rows", "inter", "dtype"), [(1, 128, torch.float32), (3, 1408, torch.float32),
                                                      (2, 200, torch.bfloat16)])
def test_silu_mul_equals_silu_of_gate_times_up(rows, inter, dtype):
    gu = torch.randn(rows, 2 * inter, generator=torch.Generator().manual_seed(inter)).to(dtype).to(DEV)
    ref = F.silu(gu.cpu()[:, :inter]).mul_(gu.cpu()[:, inter:])
    tol = {"rtol": 1e-5, "atol": 1e-5} if dtype == torch.float32 else {"rtol": 1.6e-2, "atol": 1.6e-2}
    torch.testing.assert_close(tk.silu_mul(gu).cpu(), ref, **tol)



# run in a fresh process: under TRITON_INTERPRET (this module's process) triton.language is patched
# for the interpreter and the compiler cannot run beside it
_AOT = """
import sys
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from zgtool.engine import triton_kernels as tk

c = "constexpr"
for dt, arch, n in (("bf16", 90, 4), ("fp32", 90, 1)):  # fp32: the decode kernel's exact ("ieee") dots
  kernels = [
      (tk._paged_decode_kernel,
       {"q_ptr": f"*{dt}", "k_ptr": f"*{dt}", "v_ptr": f"*{dt}", "tables_ptr": "*i64", "ctx_ptr": "*i64",
        "out_ptr": f"*{dt}", "stride_qt": "i32", "stride_qh": "i32", "stride_ot": "i32", "stride_oh": "i32",
        "stride_tab": "i32", "scale": "fp32", "KVH": c, "GROUP": c, "D": c, "G_PAD": c, "D_PAD": c, "BS": c,
        "BLOCK_N": c},
       {"KVH": 8, "GROUP": 4, "D": 80, "G_PAD": 16, "D_PAD": 128, "BS": 16, "BLOCK_N": tk.BLOCK_N}),
      (tk._add_rms_norm_kernel,
       {"x_ptr": f"*{dt}", "delta_ptr": f"*{dt}", "w_ptr": f"*{dt}", "h_ptr": f"*{dt}", "n_cols": "i32",
        "eps": "fp32", "HAS_DELTA": c, "BLOCK": c}, {"HAS_DELTA": True, "BLOCK": 4096}),
      (tk._rope_kv_kernel,
       {"qkv_ptr": f"*{dt}", "cos_ptr": f"*{dt}", "sin_ptr": f"*{dt}", "pos_ptr": "*i64", "slot_ptr": "*i64",
        "q_ptr": f"*{dt}", "k_ptr": f"*{dt}", "v_ptr": f"*{dt}", "stride_qkv": "i32", "NH": c, "NKV": c, "D": c,
        "D_PAD": c}, {"NH": 32, "NKV": 8, "D": 128, "D_PAD": 128}),
      (tk._silu_mul_kernel, {"gu_ptr": f"*{dt}", "out_ptr": f"*{dt}", "inter": "i32", "stride_gu": "i32",
                             "BLOCK": c}, {"BLOCK": 1024}),
  ]
  for fn, sig, consts in kernels[:n]:
      k = triton.compile(ASTSource(fn=fn, signature=sig, constexprs=consts), target=GPUTarget("cuda", arch, 32))
      assert k.asm["cubin"], fn
      print("compiled", dt, arch, fn.fn.__name__)
"""


@pytest.mark.slow
def test_every_kernel_compiles_for_the_gpus_we_measure_on_without_one(tmp_path):
    """Ahead of time for sm_90 (H100/H200), with triton's own ptxas: the device run finds no kernel
    that the interpreter accepted and the compiler does not."""
    import subprocess
    import sys

    import triton

    if "nvidia" not in getattr(triton.backends, "backends", {}):
        pytest.skip("this triton has no NVIDIA backend")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_DEFAULT_FP_FUSION"] = env.get("TRITON_DEFAULT_FP_FUSION", "1")
    env["TRITON_CACHE_DIR"] = str(tmp_path)  # compiled here and now, never a cached binary
    proc = subprocess.run([sys.executable, "-c", _AOT], capture_output=True, text=True, env=env, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.count("compiled") == 5

"""Triton kernels for the CUDA step (issue 35): paged decode attention over the block table,
RMSNorm fused with the residual add, RoPE fused with the KV write, SiLU fused with the up product.

Importing this module imports triton (it ships with CUDA torch; the CPU test suite installs it
through the `test` extra and runs these kernels in Triton's interpreter, TRITON_INTERPRET=1, on CPU
tensors: tests/engine/test_triton_kernels.py). Callers import it lazily, where `available()` said yes.

Every kernel reads its metadata (positions, slots, block tables, context lengths) from device
tensors and never from the host, so a step made of them can be captured in a CUDA graph and
replayed with new metadata written into the same buffers (engine/cuda_runner.py).

Layouts (engine/model.py): the KV pool is [slots, KVH, D] per layer, slot = block * bs + offset;
q/out are [T, H, D] (any strides on T and H, D contiguous); a block table row lists one
sequence's blocks, padded with any valid block id.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

# tl.dot needs every dimension >= 16: a GQA group of query heads is padded to at least this many rows
MIN_DOT = 16
# KV positions per iteration of the decode kernel (any block size: each position finds its block)
BLOCK_N = 64


def _pow2(n: int, floor: int = MIN_DOT) -> int:
    return max(floor, triton.next_power_of_2(n))


@triton.jit
def _paged_decode_kernel(q_ptr, k_ptr, v_ptr, tables_ptr, ctx_ptr, out_ptr,
                         stride_qt, stride_qh, stride_ot, stride_oh, stride_tab, scale,
                         KVH: tl.constexpr, GROUP: tl.constexpr, D: tl.constexpr, G_PAD: tl.constexpr,
                         D_PAD: tl.constexpr, BS: tl.constexpr, BLOCK_N: tl.constexpr):
    """One program per (query row, KV head): the GROUP query heads sharing that KV head attend over
    the row's first ctx positions, BLOCK_N at a time, with an online softmax in fp32."""
    row = tl.program_id(0)
    kvh = tl.program_id(1)
    g = tl.arange(0, G_PAD)
    d = tl.arange(0, D_PAD)
    n = tl.arange(0, BLOCK_N)
    gmask = g < GROUP
    dmask = d < D
    heads = kvh * GROUP + g
    qmask = gmask[:, None] & dmask[None, :]
    q = tl.load(q_ptr + row * stride_qt + heads[:, None] * stride_qh + d[None, :], mask=qmask, other=0.0).to(tl.float32)
    ctx = tl.load(ctx_ptr + row)
    m_i = tl.full([G_PAD], float("-inf"), tl.float32)
    l_i = tl.zeros([G_PAD], tl.float32)
    acc = tl.zeros([G_PAD, D_PAD], tl.float32)
    for start in range(0, ctx, BLOCK_N):
        t = start + n
        tmask = t < ctx
        blk = tl.load(tables_ptr + row * stride_tab + t // BS, mask=tmask, other=0)
        off = ((blk * BS + t % BS) * KVH + kvh)[:, None] * D + d[None, :]
        kvmask = tmask[:, None] & dmask[None, :]
        k = tl.load(k_ptr + off, mask=kvmask, other=0.0).to(tl.float32)
        s = tl.dot(q, tl.trans(k), input_precision="ieee") * scale  # [G_PAD, BLOCK_N]
        s = tl.where(tmask[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.exp(m_i - m_new)
        p = tl.exp(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(v_ptr + off, mask=kvmask, other=0.0).to(tl.float32)
        acc = acc * alpha[:, None] + tl.dot(p, v, input_precision="ieee")
        m_i = m_new
    out = acc / l_i[:, None]
    tl.store(out_ptr + row * stride_ot + heads[:, None] * stride_oh + d[None, :],
             out.to(out_ptr.dtype.element_ty), mask=qmask)


def paged_decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, tables: torch.Tensor,
                           ctx_lens: torch.Tensor, block_size: int, scale: float,
                           out: torch.Tensor | None = None) -> torch.Tensor:
    """q [T, H, D] (row i attends over the first ctx_lens[i] positions of the sequence whose block
    table is tables[i]), k/v_cache [slots, KVH, D] -> [T, H, D] in q's dtype."""
    t, h, d = q.shape
    kvh = k_cache.shape[1]
    if h % kvh or k_cache.shape[2] != d or q.stride(2) != 1 or not k_cache.is_contiguous():
        raise ValueError(f"paged_decode_attention: q {tuple(q.shape)} over a {tuple(k_cache.shape)} pool")
    if out is None:
        out = torch.empty((t, h, d), dtype=q.dtype, device=q.device)
    if t == 0:
        return out
    group = h // kvh
    _paged_decode_kernel[(t, kvh)](
        q, k_cache, v_cache, tables, ctx_lens, out, q.stride(0), q.stride(1), out.stride(0), out.stride(1),
        tables.stride(0), float(scale), KVH=kvh, GROUP=group, D=d, G_PAD=_pow2(group), D_PAD=_pow2(d),
        BS=block_size, BLOCK_N=BLOCK_N)
    return out


@triton.jit
def _add_rms_norm_kernel(x_ptr, delta_ptr, w_ptr, h_ptr, n_cols, eps, HAS_DELTA: tl.constexpr,
                         BLOCK: tl.constexpr):
    """Row r: x[r] += delta[r] (rounded to x's dtype, as torch's in-place add), then
    h[r] = w * (x[r] * rsqrt(mean(x[r]^2) + eps)) with the normalised row rounded to x's dtype
    before the weight multiplies it (engine/model.py rms_norm)."""
    row = tl.program_id(0)
    c = tl.arange(0, BLOCK)
    m = c < n_cols
    x = tl.load(x_ptr + row * n_cols + c, mask=m, other=0.0)
    if HAS_DELTA:
        dl = tl.load(delta_ptr + row * n_cols + c, mask=m, other=0.0)
        x = (x.to(tl.float32) + dl.to(tl.float32)).to(x_ptr.dtype.element_ty)
        tl.store(x_ptr + row * n_cols + c, x, mask=m)
    xf = x.to(tl.float32)
    r = 1.0 / tl.sqrt(tl.sum(xf * xf, 0) / n_cols + eps)
    w = tl.load(w_ptr + c, mask=m, other=0.0).to(tl.float32)
    hn = (xf * r).to(x_ptr.dtype.element_ty).to(tl.float32)
    tl.store(h_ptr + row * n_cols + c, (hn * w).to(h_ptr.dtype.element_ty), mask=m)


def add_rms_norm(x: torch.Tensor, delta: torch.Tensor | None, w: torch.Tensor, eps: float) -> torch.Tensor:
    """x [T, N] contiguous (updated in place: x += delta) -> rms_norm(x) * w, a new [T, N]."""
    t, ncols = x.shape
    if not x.is_contiguous() or (delta is not None and (not delta.is_contiguous() or delta.shape != x.shape)):
        raise ValueError("add_rms_norm: x and delta must be contiguous and of one shape")
    h = torch.empty_like(x)
    if t:
        _add_rms_norm_kernel[(t,)](x, x if delta is None else delta, w, h, ncols, float(eps),
                                   HAS_DELTA=delta is not None, BLOCK=triton.next_power_of_2(ncols))
    return h


@triton.jit
def _rope_kv_kernel(qkv_ptr, cos_ptr, sin_ptr, pos_ptr, slot_ptr, q_ptr, k_ptr, v_ptr, stride_qkv,
                    NH: tl.constexpr, NKV: tl.constexpr, D: tl.constexpr, D_PAD: tl.constexpr):
    """Program (token, head) over the fused qkv row's NH + 2 NKV heads: q and k heads rotated
    (x * cos + flip_halves(x) * sin_signed, the product x * cos rounded to the dtype first as torch's
    addcmul does), q into q_ptr [T, NH, D], k and v into the pool at the token's slot."""
    t = tl.program_id(0)
    j = tl.program_id(1)
    d = tl.arange(0, D_PAD)
    dm = d < D
    src = qkv_ptr + t * stride_qkv + j * D
    x = tl.load(src + d, mask=dm, other=0.0)
    slot = tl.load(slot_ptr + t)
    if j < NH + NKV:
        pos = tl.load(pos_ptr + t)
        flipped = tl.load(src + (d + D // 2) % D, mask=dm, other=0.0).to(tl.float32)
        c = tl.load(cos_ptr + pos * D + d, mask=dm, other=0.0).to(tl.float32)
        s = tl.load(sin_ptr + pos * D + d, mask=dm, other=0.0).to(tl.float32)
        a = (x.to(tl.float32) * c).to(x.dtype).to(tl.float32)
        r = (a + flipped * s).to(q_ptr.dtype.element_ty)
        if j < NH:
            tl.store(q_ptr + (t * NH + j) * D + d, r, mask=dm)
        else:
            tl.store(k_ptr + (slot * NKV + (j - NH)) * D + d, r.to(k_ptr.dtype.element_ty), mask=dm)
    else:
        tl.store(v_ptr + (slot * NKV + (j - NH - NKV)) * D + d, x.to(v_ptr.dtype.element_ty), mask=dm)


def rope_kv_write(qkv: torch.Tensor, num_heads: int, num_kv_heads: int, cos: torch.Tensor, sin_signed: torch.Tensor,
                  positions: torch.Tensor, slots: torch.Tensor, k_cache: torch.Tensor,
                  v_cache: torch.Tensor) -> torch.Tensor:
    """qkv [T, (H + 2 KVH) * D] (row stride any, columns contiguous), cos/sin_signed [P, D] ->
    rotated q [T, H, D]; rotated k and v written into the pool at slots."""
    t = qkv.shape[0]
    d = k_cache.shape[2]
    if qkv.stride(1) != 1 or qkv.shape[1] != (num_heads + 2 * num_kv_heads) * d or not k_cache.is_contiguous():
        raise ValueError(f"rope_kv_write: qkv {tuple(qkv.shape)} for {num_heads}+2x{num_kv_heads} heads of {d}")
    q = torch.empty((t, num_heads, d), dtype=qkv.dtype, device=qkv.device)
    if t:
        _rope_kv_kernel[(t, num_heads + 2 * num_kv_heads)](
            qkv, cos, sin_signed, positions, slots, q, k_cache, v_cache, qkv.stride(0),
            NH=num_heads, NKV=num_kv_heads, D=d, D_PAD=triton.next_power_of_2(d))
    return q


@triton.jit
def _silu_mul_kernel(gu_ptr, out_ptr, inter, stride_gu, BLOCK: tl.constexpr):
    """out[t] = silu(gate[t]) * up[t] for gu = [gate | up]; silu rounded to the dtype before the
    product, as torch's F.silu(gate).mul_(up) does."""
    t = tl.program_id(0)
    c = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    m = c < inter
    g = tl.load(gu_ptr + t * stride_gu + c, mask=m, other=0.0).to(tl.float32)
    u = tl.load(gu_ptr + t * stride_gu + inter + c, mask=m, other=0.0).to(tl.float32)
    a = (g / (1.0 + tl.exp(-g))).to(out_ptr.dtype.element_ty).to(tl.float32)
    tl.store(out_ptr + t * inter + c, (a * u).to(out_ptr.dtype.element_ty), mask=m)


def silu_mul(gu: torch.Tensor) -> torch.Tensor:
    """gu [T, 2I] (gate | up, columns contiguous) -> silu(gate) * up [T, I], one pass."""
    t, two_i = gu.shape
    inter = two_i // 2
    if gu.stride(1) != 1 or two_i % 2:
        raise ValueError(f"silu_mul: gu {tuple(gu.shape)} must be [T, 2I] with contiguous columns")
    out = torch.empty((t, inter), dtype=gu.dtype, device=gu.device)
    if t:
        block = min(1024, triton.next_power_of_2(inter))
        _silu_mul_kernel[(t, triton.cdiv(inter, block))](gu, out, inter, gu.stride(0), BLOCK=block)
    return out

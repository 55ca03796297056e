"""The C paged decode-attention kernel (engine/cpu_kernels.py) equals SDPA over the gathered
context within 1e-5 in fp32, never reads past a sequence's length, and the engine that uses it
decodes exactly like the gather+SDPA path."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from zgtool.engine import Engine, EngineConfig, SamplingParams
from zgtool.engine.cpu_kernels import cpu_has_avx2_fma, paged_decode_attention

pytestmark = pytest.mark.skipif(not cpu_has_avx2_fma(), reason="the kernel needs AVX2 + FMA")


def _reference(q: torch.Tensor, kc: torch.Tensor, vc: torch.Tensor, tables: torch.Tensor, lens: torch.Tensor,
               bs: int, scale: float) -> torch.Tensor:
    outs = []
    for b in range(q.shape[0]):
        n = int(lens[b])
        slots = (tables[b][:, None] * bs + torch.arange(bs)).reshape(-1)[:n]
        kk, vv = kc[slots].transpose(0, 1)[None], vc[slots].transpose(0, 1)[None]
        outs.append(F.scaled_dot_product_attention(q[b][None, :, None], kk, vv, enable_gqa=True, scale=scale)[0, :, 0])
    return torch.stack(outs)


@pytest.mark.parametrize(("heads", "kv_heads", "head_dim"), [(8, 4, 64), (9, 3, 64), (4, 4, 32), (6, 2, 24)])
def test_kernel_equals_sdpa_over_the_gathered_context(heads: int, kv_heads: int, head_dim: int) -> None:
    g = torch.Generator().manual_seed(heads * 100 + head_dim)
    bs, nblocks, batch = 16, 64, 6
    kc = torch.randn(nblocks * bs, kv_heads, head_dim, generator=g)
    vc = torch.randn(nblocks * bs, kv_heads, head_dim, generator=g)
    lens = torch.tensor([1, 2, 15, 16, 17, 150])
    width = -(-int(lens.max()) // bs)
    tables = torch.randperm(nblocks, generator=g)[: batch * width].view(batch, width).clone()
    q = torch.randn(batch, heads, head_dim, generator=g) * 3
    scale = head_dim ** -0.5
    got = paged_decode_attention(q, kc, vc, tables, lens, bs, scale)
    assert got.shape == (batch, heads, head_dim) and got.dtype == torch.float32
    torch.testing.assert_close(got, _reference(q, kc, vc, tables, lens, bs, scale), rtol=1e-5, atol=1e-5)


def test_positions_past_a_sequences_length_are_never_read() -> None:
    bs = 4
    kc, vc = torch.randn(8 * bs, 1, 8), torch.randn(8 * bs, 1, 8)
    tables, lens, q = torch.tensor([[2, 5]]), torch.tensor([5]), torch.randn(1, 1, 8)
    before = paged_decode_attention(q, kc, vc, tables, lens, bs, 0.3)
    tail = (5 * bs + 1) + torch.arange(bs - 1)  # block 5 holds positions 4..7: only position 4 counts
    kc[tail], vc[tail] = float("nan"), float("nan")
    kc[bs * 7:], vc[bs * 7:] = float("nan"), float("nan")
    assert torch.equal(paged_decode_attention(q, kc, vc, tables, lens, bs, 0.3), before)


def test_engine_with_the_kernel_decodes_like_the_gather_and_sdpa_path() -> None:
    prompts = [[256, *range(300, 300 + n)] for n in (5, 30, 61)]
    greedy = SamplingParams(max_tokens=20, temperature=0, ignore_eos=True)
    outs = []
    for kernel in (True, False):
        e = Engine(EngineConfig(model="dummy:tiny", dtype="float32", device="cpu", enable_prefix_caching=False))
        assert e.model is not None and e.model.attn_kernel  # on by default for fp32 on an AVX2 CPU
        e.model.attn_kernel = kernel
        outs.append([r.output_token_ids for r in e.generate(prompts, greedy)])
    assert outs[0] == outs[1]


@pytest.mark.parametrize("rows", [1, 16])
def test_fused_residual_add_and_rms_norm_equals_torch(rows: int) -> None:
    from zgtool.engine.cpu_kernels import add_rms_norm

    g = torch.Generator().manual_seed(rows)
    x, delta, w = torch.randn(rows, 576, generator=g) * 4, torch.randn(rows, 576, generator=g), torch.rand(576)
    ref_x = x + delta
    ref = F.rms_norm(ref_x, (576,), w, 1e-5)
    got = add_rms_norm(x, delta, w, 1e-5)
    assert torch.equal(x, ref_x)  # the residual stream is updated in place
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(add_rms_norm(x, None, w, 1e-5), ref, rtol=1e-5, atol=1e-5)


def test_without_the_kernels_fp32_falls_back_to_torch_and_int8_says_why(monkeypatch: pytest.MonkeyPatch) -> None:
    from zgtool.engine.cpu_kernels import _built_library
    from zgtool.engine.errors import ModelLoadError

    monkeypatch.setenv("ZGTOOL_NO_KERNELS", "1")
    _built_library.cache_clear()
    try:
        e = Engine(EngineConfig(model="dummy:tiny", dtype="float32", device="cpu"))
        assert e.model is not None and not e.model.attn_kernel and not e.model.fast_norm
        assert len(e.generate([256, 5, 6], SamplingParams(max_tokens=4, temperature=0)).output_token_ids) >= 1
        with pytest.raises(ModelLoadError, match="ZGTOOL_NO_KERNELS"):
            Engine(EngineConfig(model="dummy:tiny", dtype="int8", device="cpu"))
    finally:
        monkeypatch.delenv("ZGTOOL_NO_KERNELS")
        _built_library.cache_clear()


def test_fp32_gemm_equals_torch_and_keeps_rows_independent() -> None:
    from zgtool.engine.cpu_kernels import f32_gemm

    g = torch.Generator().manual_seed(5)
    w, x = torch.randn(203, 96, generator=g) * 0.1, torch.randn(11, 96, generator=g)
    ones = torch.ones(203)
    got = f32_gemm(x, w, ones)
    torch.testing.assert_close(got, (x.double() @ w.double().t()).float(), rtol=1e-5, atol=1e-5)
    for i in range(11):
        assert torch.equal(f32_gemm(x[i:i + 1], w, ones)[0], got[i])


def test_gemm_register_blocks_give_every_row_its_single_row_result() -> None:
    """Rows go through 4x3, 3x4, 2x4 and 1x4 register blocks (and 1-channel tails; from 8 rows
    the channel chunks shrink to stay in L2): whatever block a row lands in, its outputs equal
    the ones it gets alone, to the bit, in fp32 and int8, and match the torch product."""
    from zgtool.engine.cpu_kernels import f32_gemm, w8_gemm
    from zgtool.engine.quant import quantize_linear

    g = torch.Generator().manual_seed(11)
    k, n = 1536, 203  # K large enough for the L2 cap on the chunk, N no multiple of 3 or 4
    w = torch.randn(n, k, generator=g) * 0.05
    q = quantize_linear(w)
    x = torch.randn(14, k, generator=g)
    bias, ones = torch.randn(n, generator=g), torch.ones(n)
    alone_f = [f32_gemm(x[i:i + 1], w, ones, bias)[0] for i in range(14)]
    alone_q = [w8_gemm(x[i:i + 1], q.q, q.scale, bias)[0] for i in range(14)]
    for m in range(1, 15):
        got_f, got_q = f32_gemm(x[:m], w, ones, bias), w8_gemm(x[:m], q.q, q.scale, bias)
        torch.testing.assert_close(got_f, torch.addmm(bias.double(), x[:m].double(), w.double().t()).float(),
                                   rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(got_q, torch.addmm(bias, x[:m], q.dequantize().t()), rtol=1e-4, atol=1e-4)
        for i in range(m):
            assert torch.equal(got_f[i], alone_f[i]) and torch.equal(got_q[i], alone_q[i]), (m, i)


def test_the_fused_greedy_tail_picks_torch_argmaxs_token_ties_and_nans_included() -> None:
    from zgtool.engine.cpu_kernels import library

    def tail(h: torch.Tensor, w: torch.Tensor) -> tuple[list[int], torch.Tensor]:
        m, v = h.shape[0], w.shape[0]
        logits, toks, ones = torch.empty(m, v), torch.empty(m, dtype=torch.long), torch.ones(v)
        library().lm_head_argmax(h.data_ptr(), m, h.shape[1], w.data_ptr(), ones.data_ptr(), 0,
                                 logits.data_ptr(), v, toks.data_ptr(), 2)
        return toks.tolist(), logits

    h = torch.tensor([[1.0, 3.0, 3.0, 2.0, 0.0, 0.0, 0.0, 0.0],           # a tie: the first maximum
                      [-1e30] * 8,                                        # all equal
                      [-3.0, -2.0, -1.0, -4.0, -1.0, -5.0, -6.0, -7.0]])
    toks, logits = tail(h, torch.eye(8))                                  # logits == h
    assert toks == torch.argmax(logits, dim=-1).tolist() == [1, 0, 2]
    w = torch.eye(8)
    w[5, :2] = torch.tensor([float("inf"), float("-inf")])               # logit 5: inf - inf = NaN
    toks, logits = tail(torch.tensor([[1.0, 1.0, 9.0, 0.0, 0.0, 0.0, 0.0, 0.0]]), w)
    assert logits[0, 5].isnan() and logits[0, 2] == 9.0
    assert toks == torch.argmax(logits, dim=-1).tolist() == [5]           # a NaN beats any number


@pytest.mark.parametrize("dtype", ["float32", "int8"])
def test_greedy_tokens_equal_the_argmax_of_the_logits_path(dtype: str) -> None:
    e = Engine(EngineConfig(model="dummy:tiny", dtype=dtype, device="cpu"))
    assert e.model is not None
    hidden = torch.randn(7, e.model.spec.hidden_size, generator=torch.Generator().manual_seed(2))
    assert e.model.greedy_tokens(hidden) == e.model.logits(hidden).argmax(dim=-1).tolist()


@pytest.fixture
def restore_threads() -> object:
    before = torch.get_num_threads()
    yield before
    torch.set_num_threads(before)


def test_fp32_gemm_with_a_bias_adds_it_per_output_channel() -> None:
    from zgtool.engine.cpu_kernels import f32_gemm

    g = torch.Generator().manual_seed(6)
    w, x, b = torch.randn(130, 64, generator=g), torch.randn(5, 64, generator=g), torch.randn(130, generator=g)
    torch.testing.assert_close(f32_gemm(x, w, torch.ones(400), b), torch.addmm(b, x, w.t()), rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="scales"):
        f32_gemm(x, w, torch.ones(100))


@pytest.mark.parametrize("rows", [1, 3, 4, 16, 33])
def test_kernels_give_bit_identical_results_whatever_the_thread_count(rows: int, restore_threads: object) -> None:
    """Work is split over threads by output channel and (sequence, KV head): no output's
    arithmetic changes with the split, so 1, 2 and 3 threads agree to the bit."""
    from zgtool.engine.cpu_kernels import f32_gemm, w8_gemm
    from zgtool.engine.quant import quantize_linear

    g = torch.Generator().manual_seed(rows)
    w, x = torch.randn(1000, 96, generator=g), torch.randn(rows, 96, generator=g)
    q = quantize_linear(w)
    bs, kvh, heads = 16, 3, 9
    kc, vc = torch.randn(64 * bs, kvh, 64, generator=g), torch.randn(64 * bs, kvh, 64, generator=g)
    lens = torch.randint(1, 200, (rows,), generator=g)
    tables = torch.randint(0, 64, (rows, 13), generator=g)
    qa = torch.randn(rows, heads, 64, generator=g)
    results = []
    for threads in (1, 2, 3):
        torch.set_num_threads(threads)
        results.append((f32_gemm(x, w, torch.ones(1000)), w8_gemm(x, q.q, q.scale),
                        paged_decode_attention(qa, kc, vc, tables, lens, bs, 0.125)))
    for other in results[1:]:
        for a, b in zip(results[0], other, strict=True):
            assert torch.equal(a, b)


def test_fused_silu_mul_equals_torch_over_the_whole_float_range() -> None:
    from zgtool.engine.cpu_kernels import silu_mul

    g = torch.Generator().manual_seed(7)
    gu = torch.randn(5, 2 * 48, generator=g) * 6
    gu[0, :8] = torch.tensor([-200.0, -90.0, -30.0, 0.0, 30.0, 90.0, 200.0, -1e-30])
    i = gu.shape[1] // 2
    want = F.silu(gu[:, :i]) * gu[:, i:]
    got = silu_mul(gu.contiguous())
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got, want, rtol=2e-6, atol=1e-6)


def test_fused_rope_and_kv_write_equals_the_torch_path() -> None:
    from zgtool.engine.cpu_kernels import rope_kv_write

    g = torch.Generator().manual_seed(8)
    heads, kvh, d, slots_n = 9, 3, 64, 40
    t = 5
    qkv = torch.randn(t, (heads + 2 * kvh) * d, generator=g)
    positions = torch.tensor([0, 7, 8, 31, 100])
    slots = torch.tensor([3, 17, 0, 39, 22])
    inv = 1.0 / (10000 ** (torch.arange(0, d, 2).float() / d))
    freqs = torch.outer(torch.arange(128).float(), inv)
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos(), emb.sin()
    sin_signed = torch.cat((-sin[:, : d // 2], sin[:, d // 2:]), dim=-1).contiguous()
    kc, vc = torch.zeros(slots_n, kvh, d), torch.zeros(slots_n, kvh, d)
    q = rope_kv_write(qkv, heads, kvh, cos, sin_signed, positions, slots, kc, vc)

    def rope(x: torch.Tensor) -> torch.Tensor:  # transformers' rotate_half form
        x1, x2 = x[..., : d // 2], x[..., d // 2:]
        return x * cos[positions][:, None] + torch.cat((-x2, x1), dim=-1) * sin[positions][:, None]

    view = qkv.view(t, heads + 2 * kvh, d)
    torch.testing.assert_close(q, rope(view[:, :heads]), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(kc[slots], rope(view[:, heads:heads + kvh]), rtol=1e-5, atol=1e-5)
    assert torch.equal(vc[slots], view[:, heads + kvh:])
    untouched = torch.ones(slots_n, dtype=torch.bool)
    untouched[slots] = False
    assert not kc[untouched].any() and not vc[untouched].any()


def test_kernels_called_from_two_threads_at_once_both_get_their_own_result(restore_threads: object) -> None:
    """The work-sharing pool runs one job at a time; a second caller meanwhile computes alone
    (never shares the first caller's job state), so concurrent callers stay correct."""
    import threading

    from zgtool.engine.cpu_kernels import f32_gemm, w8_gemm
    from zgtool.engine.quant import quantize_linear

    torch.set_num_threads(2)
    g = torch.Generator().manual_seed(9)
    w = torch.randn(2048, 64, generator=g)
    q = quantize_linear(w)
    xs = [torch.randn(5, 64, generator=g) for _ in range(2)]
    want = [(f32_gemm(x, w, torch.ones(2048)), w8_gemm(x, q.q, q.scale)) for x in xs]
    bad: list[int] = []

    def hammer(i: int) -> None:
        for _ in range(200):
            got = (f32_gemm(xs[i], w, torch.ones(2048)), w8_gemm(xs[i], q.q, q.scale))
            if not (torch.equal(got[0], want[i][0]) and torch.equal(got[1], want[i][1])):
                bad.append(i)

    threads = [threading.Thread(target=hammer, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert bad == []


@pytest.mark.parametrize("dtype", ["float32", "int8"])
def test_a_decode_step_in_one_c_call_is_bit_identical_to_the_kernel_by_kernel_path(
        dtype: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """step_layers composes the same kernels in the same order as _forward_fused_norms: the
    hidden states (hence logits and tokens) are equal to the bit, at batch 1 and 3."""
    from zgtool.engine.model import LlamaModel

    calls = {"fused": 0}
    real = LlamaModel._layers_one_call

    def counting(self: LlamaModel, x: torch.Tensor, meta: object) -> torch.Tensor:
        calls["fused"] += 1
        return real(self, x, meta)  # type: ignore[arg-type]

    monkeypatch.setattr(LlamaModel, "_layers_one_call", counting)
    for batch in (1, 3):
        hidden: dict[bool, list[torch.Tensor]] = {}
        for fused in (True, False):
            e = Engine(EngineConfig(model="dummy:tiny", dtype=dtype, device="cpu", enable_prefix_caching=False))
            assert e.model is not None
            e.model.fused_layers = fused
            forward = e.model.forward
            seen: list[torch.Tensor] = []

            def spy(ids: torch.Tensor, meta: object, forward: object = forward, seen: list = seen) -> torch.Tensor:
                out = forward(ids, meta)  # type: ignore[operator]
                seen.append(out.clone())
                return out

            e.model.forward = spy  # type: ignore[method-assign]
            prompts = [[256, *range(300, 300 + n)] for n in (5, 30, 61)][:batch]
            e.generate(prompts, SamplingParams(max_tokens=6, temperature=0, ignore_eos=True))
            hidden[fused] = seen
        assert len(hidden[True]) == len(hidden[False]) >= 6
        for a, b in zip(hidden[True], hidden[False], strict=True):
            assert torch.equal(a, b)
    assert calls["fused"] >= 10  # the decode steps took the one-call path (prefill steps do not)

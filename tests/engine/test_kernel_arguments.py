"""Every kernel wrapper refuses a tensor the C side cannot read (wrong dtype, shape or layout)
with a KernelArgumentError naming the kernel and the argument, before any pointer is passed:
an int32 lengths tensor used to crash the process."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from zgtool.engine import cpu_kernels as ck

pytestmark = pytest.mark.skipif(not ck.cpu_has_avx2_fma(), reason="the kernels need AVX2 + FMA")

BS, KVH, H, D = 16, 2, 4, 32


def _attn(**bad: torch.Tensor) -> Callable[[], object]:
    args = {"q": torch.randn(2, H, D), "k_cache": torch.randn(4 * BS, KVH, D), "v_cache": torch.randn(4 * BS, KVH, D),
            "tables": torch.tensor([[0, 1], [2, 3]]), "lens": torch.tensor([5, 20])}
    args.update(bad)
    return lambda: ck.paged_decode_attention(args["q"], args["k_cache"], args["v_cache"], args["tables"],
                                             args["lens"], BS, D ** -0.5)


def _rope(**bad: torch.Tensor) -> Callable[[], object]:
    args = {"qkv": torch.randn(3, (H + 2 * KVH) * D), "cos": torch.randn(64, D), "sin": torch.randn(64, D),
            "positions": torch.tensor([0, 1, 2]), "slots": torch.tensor([0, 1, 2]),
            "k_cache": torch.zeros(4 * BS, KVH, D), "v_cache": torch.zeros(4 * BS, KVH, D)}
    args.update(bad)
    return lambda: ck.rope_kv_write(args["qkv"], H, KVH, args["cos"], args["sin"], args["positions"], args["slots"],
                                    args["k_cache"], args["v_cache"])


def test_the_valid_calls_behind_these_cases_run() -> None:
    assert _attn()().shape == (2, H, D)
    assert _rope()().shape == (3, H, D)


@pytest.mark.parametrize(("case", "call", "named"), [
    ("int32 lens", _attn(lens=torch.tensor([5, 20], dtype=torch.int32)), "lens"),
    ("int32 tables", _attn(tables=torch.tensor([[0, 1], [2, 3]], dtype=torch.int32)), "tables"),
    ("lens of the wrong length", _attn(lens=torch.tensor([5, 20, 3])), "lens"),
    ("strided lens", _attn(lens=torch.tensor([5, 9, 20, 9])[::2]), "lens"),
    ("fp16 q", _attn(q=torch.randn(2, H, D).half()), "q"),
    ("non-contiguous cache", _attn(k_cache=torch.randn(KVH, 4 * BS, D).transpose(0, 1)), "k_cache"),
    ("v cache of another shape", _attn(v_cache=torch.randn(2 * BS, KVH, D)), "v_cache"),
    ("int32 positions", _rope(positions=torch.tensor([0, 1, 2], dtype=torch.int32)), "positions"),
    ("int32 slots", _rope(slots=torch.tensor([0, 1, 2], dtype=torch.int32)), "slots"),
    ("fp64 cos", _rope(cos=torch.randn(64, D, dtype=torch.float64)), "cos"),
    ("cache with other KV heads", _rope(k_cache=torch.zeros(4 * BS, 3, D)), "k_cache"),
    ("non-contiguous v cache", _rope(v_cache=torch.zeros(KVH, 4 * BS, D).transpose(0, 1)), "v_cache"),
])
def test_attention_and_rope_refuse_what_they_cannot_read(case: str, call: Callable[[], object], named: str) -> None:
    with pytest.raises(ck.KernelArgumentError, match=rf"\b{named} must be"):
        call()


@pytest.mark.parametrize(("case", "call", "named"), [
    ("int8 gemm over fp32 weights", lambda: ck.w8_gemm(torch.randn(2, 64), torch.randn(8, 64), torch.ones(8)), "w"),
    ("fp64 activations", lambda: ck.w8_gemm(torch.randn(2, 64, dtype=torch.float64),
                                            torch.zeros(8, 64, dtype=torch.int8), torch.ones(8)), "x"),
    ("short scale", lambda: ck.w8_gemm(torch.randn(2, 64), torch.zeros(8, 64, dtype=torch.int8), torch.ones(4)),
     "scale"),
    ("transposed weights", lambda: ck.f32_gemm(torch.randn(2, 64), torch.randn(64, 64).t(), torch.ones(64)), "w"),
    ("int64 ones", lambda: ck.f32_gemm(torch.randn(2, 64), torch.randn(8, 64), torch.ones(8, dtype=torch.int64)),
     "ones"),
    ("bias of the wrong size", lambda: ck.f32_gemm(torch.randn(2, 64), torch.randn(8, 64), torch.ones(8),
                                                   torch.zeros(7)), "bias"),
    ("non-contiguous norm input", lambda: ck.add_rms_norm(torch.randn(64, 4).t(), None, torch.ones(64), 1e-5), "x"),
    ("norm weight of the wrong size", lambda: ck.add_rms_norm(torch.randn(4, 64), None, torch.ones(32), 1e-5), "w"),
    ("fp16 delta", lambda: ck.add_rms_norm(torch.randn(4, 64), torch.randn(4, 64).half(), torch.ones(64), 1e-5),
     "delta"),
    ("int8 gate_up", lambda: ck.silu_mul(torch.zeros(2, 64, dtype=torch.int8)), "gate_up"),
    ("dequant into fp16", lambda: ck.w8_dequant(torch.zeros(8, 64, dtype=torch.int8), torch.ones(8),
                                                torch.zeros(8, 64, dtype=torch.float16)), "out"),
    ("bf16 gemm over fp32 weights", lambda: ck.bf16_gemm(torch.randn(2, 64), torch.randn(8, 64), torch.ones(8)), "w"),
    ("bf16 activations", lambda: ck.bf16_gemm(torch.randn(2, 64).bfloat16(), torch.randn(8, 64).bfloat16(),
                                              torch.ones(8)), "x"),
    ("w8a8 over bf16 weights", lambda: ck.w8a8_gemm(torch.randn(2, 64), torch.randn(8, 64).bfloat16(),
                                                    torch.ones(8)), "w"),
])
def test_gemms_and_glue_refuse_what_they_cannot_read(case: str, call: Callable[[], object], named: str) -> None:
    with pytest.raises(ck.KernelArgumentError, match=rf"\b{named} must be"):
        call()


def test_the_error_says_what_was_expected_and_what_came() -> None:
    with pytest.raises(ck.KernelArgumentError) as err:
        _attn(lens=torch.tensor([5, 20], dtype=torch.int32))()
    assert "paged_decode_attention: lens must be a contiguous torch.int64 CPU tensor [2]" in str(err.value)
    assert "torch.int32" in str(err.value)


@pytest.mark.parametrize("n", [1, 7, 8, 9, 49152, 49155])
def test_nonfinite_rows_agrees_with_torch_isfinite(n: int) -> None:
    g = torch.Generator().manual_seed(n)
    x = torch.randn(6, n, generator=g)
    x[1, n - 1] = float("nan")
    x[3, 0] = float("inf")
    x[4, n // 2] = -float("inf")
    x[5, n // 3] = 3.0e38
    want = [int(i) for i in (~torch.isfinite(x).all(dim=-1)).nonzero().flatten()]
    assert ck.nonfinite_rows(x) == want == [1, 3, 4]


def test_nonfinite_rows_refuses_fp16() -> None:
    with pytest.raises(ck.KernelArgumentError, match="x must be"):
        ck.nonfinite_rows(torch.zeros(2, 8, dtype=torch.float16))


def _step_model(dtype: str) -> tuple[object, object]:
    from zgtool.engine import Engine, EngineConfig
    from zgtool.engine.model import build_attn_meta

    e = Engine(EngineConfig(model="dummy:tiny", dtype=dtype, device="cpu", block_size=16))
    meta = build_attn_meta([0, 1], [0, 1], [], [], [], [(0, 2, [0], 0)], 16, torch.device("cpu"))
    return e.model, meta


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "int8"])
def test_the_one_call_step_checks_every_tensor_before_the_call(dtype: str) -> None:
    model, meta = _step_model(dtype)
    x = torch.randn(2, model.spec.hidden_size)  # type: ignore[attr-defined]
    assert model._layers_one_call(x.clone(), meta).shape == x.shape  # type: ignore[attr-defined]
    bad = dict(vars(meta))
    bad["positions"] = meta.positions.to(torch.int32)  # type: ignore[attr-defined]
    with pytest.raises(ck.KernelArgumentError, match="step_layers: positions must be"):
        model._layers_one_call(x.clone(), type(meta)(**bad))  # type: ignore[attr-defined]
    with pytest.raises(ck.KernelArgumentError, match="step_layers: x must be"):
        model._layers_one_call(x.double(), meta)  # type: ignore[attr-defined]


def test_a_layer_weight_of_another_element_is_refused_before_the_step() -> None:
    model, meta = _step_model("bfloat16")
    model.layers[0].o = model.layers[0].o.float()  # type: ignore[attr-defined]
    model.cpu._ptrs_key = -1  # type: ignore[attr-defined]
    with pytest.raises(ck.KernelArgumentError, match="step_layers: o must be a contiguous torch.bfloat16"):
        model._layers_one_call(torch.randn(2, model.spec.hidden_size), meta)  # type: ignore[attr-defined]

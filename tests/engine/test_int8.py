"""`--dtype int8` (weight-only int8 projections + lm_head, fp32 activations): the AVX2 kernel
equals the dequantized fp32 reference, rows never influence each other, and the int8 engine
tracks the fp32 one on a written Qwen2 checkpoint (biases) and on SmolLM2."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from zgtool.engine import Engine, EngineConfig, SamplingParams
from zgtool.engine import cpu_kernels as ck
from zgtool.engine.cpu_kernels import cpu_has_avx2_fma, w8_gemm
from zgtool.engine.quant import Int8Weight, quantize_linear

pytestmark = pytest.mark.skipif(not cpu_has_avx2_fma(), reason="the int8 kernel needs AVX2 + FMA")

LOGIT_REL_TOL = 0.05  # int8 weights: max |logit diff| within 5% of the largest fp32 logit


def _reference(x: torch.Tensor, w: Int8Weight, bias: torch.Tensor | None) -> torch.Tensor:
    y = x.double() @ w.dequantize().double().t()
    return (y if bias is None else y + bias.double()).float()


@pytest.mark.parametrize("rows", [1, 3, 4, 5, 16, 33])
@pytest.mark.parametrize("out_features", [1, 7, 64, 130])
def test_w8_gemm_equals_the_dequantized_fp32_product(rows: int, out_features: int) -> None:
    g = torch.Generator().manual_seed(rows * 1000 + out_features)
    w = quantize_linear(torch.randn(out_features, 96, generator=g) * 0.05)
    x = torch.randn(rows, 96, generator=g)
    bias = torch.randn(out_features, generator=g)
    for b in (None, bias):
        got, ref = w8_gemm(x, w.q, w.scale, b), _reference(x, w, b)
        assert got.shape == (rows, out_features) and got.dtype == torch.float32
        torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)


def test_quantized_weights_stay_within_half_a_step_of_the_originals() -> None:
    w = torch.randn(40, 64) * 0.1
    q = quantize_linear(w)
    assert q.q.dtype == torch.int8 and q.scale.shape == (40,)
    assert ((q.dequantize() - w).abs() <= q.scale[:, None] / 2 + 1e-7).all()


def test_a_rows_result_does_not_depend_on_its_batch_neighbours() -> None:
    g = torch.Generator().manual_seed(3)
    w = quantize_linear(torch.randn(50, 64, generator=g))
    x = torch.randn(13, 64, generator=g)
    batch = w8_gemm(x, w.q, w.scale)
    for i in range(13):
        assert torch.equal(w8_gemm(x[i:i + 1], w.q, w.scale)[0], batch[i])  # bit-equal, every block position


def test_w8_gemm_rejects_an_input_size_not_divisible_by_8() -> None:
    with pytest.raises(ValueError, match="K % 8"):
        w8_gemm(torch.zeros(1, 12), torch.zeros(4, 12, dtype=torch.int8), torch.ones(4))


def _qwen2_checkpoint(tmp: Path) -> Path:
    """A tiny random Qwen2 (q/k/v biases, non-trivial norms) written by transformers."""
    transformers = pytest.importorskip("transformers")
    from zgtool.engine.tokenizer import write_byte_tokenizer_json

    cfg = transformers.Qwen2Config(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                                   bos_token_id=256, eos_token_id=257, rope_theta=1000000.0)
    torch.manual_seed(0)
    model = transformers.Qwen2ForCausalLM(cfg).eval()
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "norm" in n or n.endswith("bias"):
                p.add_(torch.randn_like(p) * 0.1)
    model.save_pretrained(tmp, safe_serialization=True)
    write_byte_tokenizer_json(tmp / "tokenizer.json", 512)
    return tmp


def _prefill_logits(engine: Engine, ids: list[int]) -> torch.Tensor:
    from zgtool.engine.model import build_attn_meta

    model = engine.model
    assert model is not None
    bs = engine.block_size
    table = list(range(-(-len(ids) // bs)))
    meta = build_attn_meta(list(range(len(ids))), [table[p // bs] * bs + p % bs for p in range(len(ids))],
                           [], [], [], [(0, len(ids), table, 0)], bs, torch.device("cpu"))
    return model.logits(model.forward(torch.tensor(ids), meta))


def test_int8_engine_tracks_fp32_logits_and_greedy_tokens_on_a_written_checkpoint(tmp_path: Path) -> None:
    path = str(_qwen2_checkpoint(tmp_path / "qwen2"))
    f32 = Engine(EngineConfig(model=path, dtype="float32", device="cpu"))
    i8 = Engine(EngineConfig(model=path, dtype="int8", device="cpu"))
    assert i8.dtype == "int8" and i8.model is not None and i8.model.dtype == torch.float32
    assert isinstance(i8.model.layers[0].qkv, Int8Weight) and i8.model.layers[0].qkv_bias is not None
    ids = [256, *range(300, 340)]
    ref, got = _prefill_logits(f32, ids), _prefill_logits(i8, ids)
    assert got.shape == ref.shape and got.dtype == torch.float32
    assert (got - ref).abs().max() <= LOGIT_REL_TOL * ref.abs().max()
    greedy = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)
    assert i8.generate(ids, greedy).output_token_ids[:2] == f32.generate(ids, greedy).output_token_ids[:2]


def test_int8_deterministic_batched_decode_equals_one_at_a_time() -> None:
    cfg = dict(model="dummy:tiny", dtype="int8", device="cpu", deterministic=True, enable_prefix_caching=False)
    prompts = [[256, *range(300, 300 + n)] for n in (3, 17, 40)]
    greedy = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)
    together = Engine(EngineConfig(**cfg)).generate(prompts, greedy)  # type: ignore[arg-type]
    alone = Engine(EngineConfig(**cfg))  # type: ignore[arg-type]
    assert [r.output_token_ids for r in together] == [alone.generate(p, greedy).output_token_ids for p in prompts]


@pytest.mark.slow
def test_int8_smollm2_still_answers_paris() -> None:
    from zgtool.engine.errors import ModelUnavailable
    from zgtool.engine.gguf_convert import ensure_converted

    try:
        ensure_converted("smollm2")
    except ModelUnavailable as exc:
        pytest.skip(f"SmolLM2 not installed: {exc}")
    e = Engine(EngineConfig(model="smollm2", dtype="int8", device="cpu", max_num_seqs=1, max_model_len=128,
                            num_threads=1))
    ids = e.tokenizer.apply_chat_template([{"role": "user", "content": "What is the capital of France?"}])
    assert "Paris" in e.generate(ids, SamplingParams(max_tokens=8, temperature=0)).text


def test_long_prefills_take_the_dequantized_mkl_path_with_the_same_result(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    import zgtool.engine.model as model_mod

    path = str(_qwen2_checkpoint(tmp_path / "qwen2"))
    e = Engine(EngineConfig(model=path, dtype="int8", device="cpu"))
    monkeypatch.setattr(model_mod, "INT8_DEQUANT_ROWS", 64)
    ids = [256, *range(300, 300 + 64 + 9)]
    via_mkl = _prefill_logits(e, ids)
    monkeypatch.setattr(model_mod, "INT8_DEQUANT_ROWS", 10**9)  # every row through the int8 kernel
    torch.testing.assert_close(_prefill_logits(e, ids), via_mkl, rtol=1e-4, atol=1e-4)


RUNNABLE_ISAS = [v.name for v in ck.VARIANTS if v.cpu_flags <= ck.cpu_flags()]


@pytest.mark.parametrize("isa", RUNNABLE_ISAS)
@pytest.mark.parametrize("k", [64, 96, 576])
def test_w8a8_gemm_equals_the_per_row_quantised_product_in_every_variant(isa: str, k: int,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ck.ISA_ENV, isa)
    g = torch.Generator().manual_seed(k)
    w = quantize_linear(torch.randn(70, k, generator=g) * 0.05)
    x = torch.randn(6, k, generator=g)
    x[3] = 0.0  # a zero row: scale 1, output = bias
    bias = torch.randn(70, generator=g)
    sx = (x.abs().amax(dim=1, keepdim=True) / 127).clamp_min(1e-30)
    sx[3] = 1.0
    xq = torch.round(x / sx).clamp(-127, 127)
    ref = ((xq.double() @ w.q.double().t()) * sx.double() * w.scale.double() + bias.double()).float()
    got = ck.w8a8_gemm(x, w.q, w.scale, bias)
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5 * ref.abs().max().item())
    assert torch.equal(ck.w8a8_gemm(x[2:3], w.q, w.scale, bias)[0], got[2])  # rows never mix
    assert bool(ck.library().w8a8_vnni(k)) == (isa == "avx512bf16" and k % 64 == 0)


def test_int8_with_quantised_activations_tracks_fp32_and_names_its_gemm(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    from zgtool.engine.quant import INT8_ACTIVATIONS_ENV

    path = str(_qwen2_checkpoint(tmp_path / "qwen2"))
    f32 = Engine(EngineConfig(model=path, dtype="float32", device="cpu"))
    monkeypatch.setenv(INT8_ACTIVATIONS_ENV, "1")
    a8 = Engine(EngineConfig(model=path, dtype="int8", device="cpu"))
    assert a8.model is not None and a8.model.backends["linear"] == "c-int8-w8a8-gemm"
    assert a8.model.backend_name == "c-kernels" and a8.model.backends["lm_head"] == "c-int8-gemm"
    ids = [256, *range(300, 340)]
    ref, got = _prefill_logits(f32, ids), _prefill_logits(a8, ids)
    # stated tolerance: int8 weights and per-row int8 activations, within 2x weight-only int8's
    assert (got - ref).abs().max() <= 2 * LOGIT_REL_TOL * ref.abs().max()
    greedy = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)
    prompts = [[256, *range(300, 300 + n)] for n in (3, 17, 40)]
    together = a8.generate(prompts, greedy)
    assert together[2].output_token_ids[:1] == f32.generate(ids, greedy).output_token_ids[:1]
    assert [r.output_token_ids for r in together] == [a8.generate(p, greedy).output_token_ids for p in prompts]

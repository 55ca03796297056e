"""Model shapes: dummy presets and the parsed form of a Hugging Face config.json."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from zgtool.engine.errors import ModelLoadError, ModelNotFound

SUPPORTED_ARCHITECTURES = ("LlamaForCausalLM", "Qwen2ForCausalLM", "MistralForCausalLM")


@dataclass(frozen=True)
class ModelSpec:
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    intermediate_size: int
    max_position_embeddings: int = 2048
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    rope_scaling: dict[str, Any] | None = field(default=None, hash=False)
    tie_word_embeddings: bool = False
    attention_bias: bool = False       # Qwen2: q/k/v biases
    head_dim: int | None = None
    architecture: str = "LlamaForCausalLM"
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()

    @property
    def dim_per_head(self) -> int:
        return self.head_dim or self.hidden_size // self.num_heads

    def num_params(self) -> int:
        d, hd = self.hidden_size, self.dim_per_head
        attn = d * hd * (self.num_heads * 2 + self.num_kv_heads * 2)
        mlp = 3 * d * self.intermediate_size
        emb = self.vocab_size * d * (1 if self.tie_word_embeddings else 2)
        return self.num_layers * (attn + mlp + 2 * d) + emb + d

    def to_hf_config(self) -> dict[str, Any]:
        """A config.json that transformers and our loader both read."""
        model_type = {"Qwen2ForCausalLM": "qwen2", "MistralForCausalLM": "mistral"}.get(self.architecture, "llama")
        cfg: dict[str, Any] = {
            "architectures": [self.architecture],
            "model_type": model_type,
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "num_hidden_layers": self.num_layers,
            "num_attention_heads": self.num_heads,
            "num_key_value_heads": self.num_kv_heads,
            "intermediate_size": self.intermediate_size,
            "max_position_embeddings": self.max_position_embeddings,
            "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope_theta,
            "rope_scaling": self.rope_scaling,
            "tie_word_embeddings": self.tie_word_embeddings,
            "hidden_act": "silu",
            "torch_dtype": "float32",
            "bos_token_id": self.bos_token_id,
            "eos_token_id": list(self.eos_token_ids) if len(self.eos_token_ids) != 1 else self.eos_token_ids[0],
        }
        if model_type == "llama":
            cfg["attention_bias"] = self.attention_bias
            cfg["mlp_bias"] = False
        if self.head_dim:
            cfg["head_dim"] = self.head_dim
        return cfg


# vocab sizes leave room for the byte tokenizer (256 bytes + specials + synthetic words)
PRESETS: dict[str, ModelSpec] = {
    "tiny": ModelSpec(vocab_size=512, hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2,
                      intermediate_size=128, max_position_embeddings=1024),
    # ~44M parameters: the embedded default, sized for a 2-core CPU
    "small": ModelSpec(vocab_size=8192, hidden_size=512, num_layers=12, num_heads=8, num_kv_heads=4,
                       intermediate_size=1408, max_position_embeddings=2048),
    # Llama-3.2-1B's shape, for GPUs
    "llama-1b": ModelSpec(vocab_size=128256, hidden_size=2048, num_layers=16, num_heads=32, num_kv_heads=8,
                          intermediate_size=8192, max_position_embeddings=8192, rope_theta=500000.0,
                          rope_scaling={"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
                                        "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
                          tie_word_embeddings=True),
    # Llama-3.1-8B's shape, for the GPU check's roofline row (bench/gpu_roofline.py): its seeded weights
    # are made on the device (engine/weights.py), 16 GB of bf16 that never cross the host
    "llama-8b": ModelSpec(vocab_size=128256, hidden_size=4096, num_layers=32, num_heads=32, num_kv_heads=8,
                          intermediate_size=14336, max_position_embeddings=8192, rope_theta=500000.0,
                          rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                        "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}),
}


def preset(name: str) -> ModelSpec:
    if name not in PRESETS:
        raise ModelNotFound(f"unknown dummy preset {name!r}; known: {', '.join(sorted(PRESETS))}")
    return PRESETS[name]


def _eos_ids(value: Any) -> tuple[int, ...]:
    if value is None:
        return ()
    if isinstance(value, list):
        return tuple(int(v) for v in value)
    return (int(value),)


def spec_from_hf_config(cfg: dict[str, Any]) -> ModelSpec:
    archs = cfg.get("architectures") or []
    arch = next((a for a in archs if a in SUPPORTED_ARCHITECTURES), None)
    if arch is None:
        raise ModelLoadError(
            f"unsupported architecture {archs or cfg.get('model_type')!r}; supported: {', '.join(SUPPORTED_ARCHITECTURES)}"
        )
    # transformers >= 5 nests rope settings under rope_parameters
    rope: dict[str, Any] = dict(cfg.get("rope_parameters") or {})
    scaling = cfg.get("rope_scaling") or None
    theta = cfg.get("rope_theta", rope.get("rope_theta", 10000.0))
    if scaling is None and rope.get("rope_type", "default") not in ("default", None):
        scaling = rope
    try:
        return ModelSpec(
            vocab_size=int(cfg["vocab_size"]),
            hidden_size=int(cfg["hidden_size"]),
            num_layers=int(cfg["num_hidden_layers"]),
            num_heads=int(cfg["num_attention_heads"]),
            num_kv_heads=int(cfg.get("num_key_value_heads") or cfg["num_attention_heads"]),
            intermediate_size=int(cfg["intermediate_size"]),
            max_position_embeddings=int(cfg.get("max_position_embeddings", 2048)),
            rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
            rope_theta=float(theta),
            rope_scaling=scaling,
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            attention_bias=arch == "Qwen2ForCausalLM" or bool(cfg.get("attention_bias", False)),
            head_dim=cfg.get("head_dim"),
            architecture=arch,
            bos_token_id=cfg.get("bos_token_id"),
            eos_token_ids=_eos_ids(cfg.get("eos_token_id")),
        )
    except KeyError as exc:
        raise ModelLoadError(f"config.json is missing {exc.args[0]!r}") from exc

"""Engine configuration (frozen, validated) and sampling parameters."""

from __future__ import annotations

from dataclasses import dataclass

from zgtool.engine.errors import InvalidRequest

DTYPES = ("auto", "float32", "bfloat16", "float16")


@dataclass(frozen=True)
class EngineConfig:
    model: str = "dummy:small"          # dummy:<preset> | null | /path/to/hf/dir
    dtype: str = "auto"                 # auto: bfloat16 on CUDA, float32 on CPU
    device: str = "auto"                # auto | cpu | cuda | cuda:N
    kv_memory_bytes: int | None = None  # KV pool budget; None -> kv_memory_fraction
    kv_memory_fraction: float = 0.3     # of free GPU memory (CUDA) or of total RAM capped at 1 GiB (CPU)
    block_size: int = 16
    max_num_seqs: int = 32              # cap on running sequences
    max_num_batched_tokens: int = 512   # per-step token budget (chunked prefill)
    max_model_len: int | None = None    # None -> the model's context
    max_waiting: int = 256              # waiting-queue cap; beyond it add_request raises Overloaded
    enable_prefix_caching: bool = True
    deterministic: bool = False         # batch-invariant greedy output (see model.py)
    seed: int = 0
    batch_window_ms: float = 0.0        # wait this long for more arrivals before a step with free capacity
    num_threads: int | None = None      # torch intra-op threads on CPU

    def __post_init__(self) -> None:
        if self.dtype not in DTYPES:
            raise InvalidRequest(f"dtype must be one of {DTYPES}, not {self.dtype!r}")
        if self.block_size < 1 or self.block_size & (self.block_size - 1):
            raise InvalidRequest("block_size must be a power of two")
        if self.max_num_seqs < 1 or self.max_num_batched_tokens < 1:
            raise InvalidRequest("max_num_seqs and max_num_batched_tokens must be >= 1")
        if not 0 < self.kv_memory_fraction <= 1:
            raise InvalidRequest("kv_memory_fraction must be in (0, 1]")
        if self.batch_window_ms < 0:
            raise InvalidRequest("batch_window_ms must be >= 0")


@dataclass(frozen=True)
class SamplingParams:
    max_tokens: int = 128
    temperature: float = 1.0            # 0 -> greedy
    top_p: float = 1.0
    top_k: int = 0                      # 0 -> off
    seed: int | None = None             # per-request generator
    stop: tuple[str, ...] = ()          # stop sequences (not included in the output)
    ignore_eos: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.max_tokens, int) or isinstance(self.max_tokens, bool) or self.max_tokens < 1:
            raise InvalidRequest(f"max_tokens must be an integer >= 1, got {self.max_tokens!r}")
        if self.temperature < 0:
            raise InvalidRequest("temperature must be >= 0")
        if not 0 < self.top_p <= 1:
            raise InvalidRequest("top_p must be in (0, 1]")
        if self.top_k < 0:
            raise InvalidRequest("top_k must be >= 0")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0 or self.top_k == 1

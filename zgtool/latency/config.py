"""The configuration of a latency split: prompts, SLOs and SplitConfig with its checks (no I/O)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from zgtool.errors import UsageError
from zgtool.workload.model import Workload

PROMPTS: dict[str, str] = {
    "short": "Say hello in one short sentence.",
    "medium": " ".join(["Summarise the trade-offs of putting an HTTP gateway in front of an inference server,"
                        " covering latency, authentication, rate limits and caching."] * 8),
    "long": " ".join(["Explain, step by step and with examples, how paged KV caches, continuous batching and"
                      " chunked prefill interact in a modern LLM serving engine."] * 60),
}
MAX_TOKENS: dict[str, int] = {"short": 16, "medium": 128, "long": 512}
SLO_KEYS = {"ttft": "ttft_ms", "tpot": "tpot_ms", "e2e": "e2e_ms", "e2el": "e2e_ms"}


DECODABLE = ("gzip", "deflate", "identity")    # content codings the measuring client decodes (zlib)


def auto_rounds(num_requests: int, concurrency: int) -> int:
    """Blocks per target: many, so the interval can resample rounds (>= 4; ~4 requests per worker
    and block up to 16 blocks; past that ~8 per worker and block, so that more requests bring more
    rounds: the paired interval narrows with rounds, not with requests within one (an A/A total_ms
    interval at -n 400 was ±1.4 ms over 16 rounds, ±0.45 ms over 80). Each block warms one
    connection per worker, unmeasured: 1 request in 9 past 16 blocks."""
    c = max(1, concurrency)
    return max(4, min(16, num_requests // max(4, c)), num_requests // (8 * c))


@dataclass(frozen=True)
class Slo:
    """Service-level objectives in ms; a request is "good" when it meets every one that is set."""

    ttft_ms: float | None = None
    tpot_ms: float | None = None
    e2e_ms: float | None = None

    def __post_init__(self) -> None:
        for name in ("ttft_ms", "tpot_ms", "e2e_ms"):
            v = getattr(self, name)
            if v is not None and not v > 0:
                raise UsageError(f"--slo {name.removesuffix('_ms')} must be a positive number of ms, not {v}")

    @classmethod
    def parse(cls, specs: str | list[str] | tuple[str, ...] | None) -> Slo | None:
        """'ttft:500 tpot:20 e2e:2000' (vLLM's --goodput form; commas or repeated options work too)."""
        if not specs:
            return None
        items = [specs] if isinstance(specs, str) else list(specs)
        found: dict[str, float] = {}
        for item in items:
            for part in item.replace(",", " ").split():
                key, sep, value = part.partition(":")
                field_name = SLO_KEYS.get(key.strip().lower())
                if not sep or field_name is None:
                    raise UsageError(f"--slo: expected ttft:MS, tpot:MS or e2e:MS, not {part!r}")
                try:
                    found[field_name] = float(value.removesuffix("ms"))
                except ValueError:
                    raise UsageError(f"--slo {key}: {value!r} is not a number of ms") from None
        return cls(**found) if found else None

    def public(self) -> dict[str, float]:
        return {k: v for k, v in (("ttft_ms", self.ttft_ms), ("tpot_ms", self.tpot_ms),
                                  ("e2e_ms", self.e2e_ms)) if v is not None}

    def met_by(self, *, ttft_ms: float | None, tpot_ms: float | None, e2e_ms: float | None,
               stream: bool) -> bool:
        if e2e_ms is None:
            return False
        first = ttft_ms if stream else e2e_ms     # a whole-body answer shows its first token at the end
        if self.ttft_ms is not None and (first is None or first > self.ttft_ms):
            return False
        if self.tpot_ms is not None and stream and tpot_ms is not None and tpot_ms > self.tpot_ms:
            return False     # vLLM: TPOT is 0 (met) for a single output token
        return not (self.e2e_ms is not None and e2e_ms > self.e2e_ms)


@dataclass(frozen=True)
class SplitConfig:
    num_requests: int = 50
    concurrency: int = 1
    warmup: int = 2
    stream: bool = True
    new_connection: bool = False
    # what the client accepts: the OpenAI and Anthropic SDKs (httpx) send "gzip, deflate", and a compressing
    # hop (nginx's gzip filter) holds back their streams; "identity" measures the path as curl sees it
    accept_encoding: str = "gzip, deflate"
    prompt: str = PROMPTS["short"]
    prompt_name: str = "short"
    max_tokens: int = MAX_TOKENS["short"]
    timeout_s: float = 30.0
    verify: bool | str = True          # False, True or a CA bundle path
    rounds: int = 0                    # targets alternate block-wise; 0: auto_rounds()
    confidence: float = 0.95
    resamples: int = 2000
    seed: int = 0
    slo: Slo | None = None
    quick: bool = False                # few requests: the figures are indicative
    family_size: int = 1               # configurations compared together (verify: its splits), for lo_adj/hi_adj
    # every block opens its connections anew (issue 25); False: each worker keeps one per target for the
    # whole run, the earlier design (bench/verdict_calibration.py compares the two)
    fresh_connections: bool = True
    # open loop (zgtool.latency.schedule.openloop): requests sent on a schedule, not when a worker is free
    rate_rps: float | None = None      # per target; None (and no schedule_s): closed loop, -c workers
    arrivals: str = "poisson"          # poisson | constant (zgtool.latency.schedule.arrivals)
    schedule_s: tuple[float, ...] | None = None   # explicit send offsets for the whole run (trace replay)
    max_in_flight: int = 0             # open-loop worker pool bound; 0: OPEN_LOOP_MAX_IN_FLIGHT
    sweep_point_s: float = 5.0         # a rate sweep's point sends for at least this long per path
    # per-request prompts and max_tokens (zgtool.workload); request i sends workload.spec(i)
    workload: Workload | None = None

    def __post_init__(self) -> None:
        self._check_open_loop()
        if self.num_requests < 1:
            raise UsageError(f"-n must be at least 1, not {self.num_requests}")
        if self.concurrency < 1:
            raise UsageError(f"-c must be at least 1, not {self.concurrency}")
        if self.warmup < 0:
            raise UsageError(f"--warmup cannot be negative ({self.warmup})")
        if self.max_tokens < 1:
            raise UsageError(f"--max-tokens must be at least 1, not {self.max_tokens}")
        if not self.prompt.strip():
            raise UsageError("the prompt is empty")
        if self.timeout_s <= 0:
            raise UsageError(f"--timeout must be positive, not {self.timeout_s}")
        bad = [e for e in (x.strip().split(";")[0].strip().lower() for x in self.accept_encoding.split(","))
               if e not in DECODABLE]
        if bad or not self.accept_encoding.strip():
            raise UsageError(f"--accept-encoding {self.accept_encoding!r}: zgtool's client decodes "
                             f"{', '.join(DECODABLE)} (a comma list of them), not {', '.join(map(repr, bad)) or 'nothing'}")
        if self.rounds < 0:
            raise UsageError(f"--rounds must be at least 1 (or 0 for automatic), not {self.rounds}")
        if not 0.5 <= self.confidence < 1.0:
            raise UsageError(f"--confidence must be in [0.5, 1), not {self.confidence}")
        if self.resamples < 100:
            raise UsageError(f"--resamples must be at least 100, not {self.resamples}")
        if self.family_size < 1:
            raise UsageError(f"family_size must be at least 1, not {self.family_size}")

    def _check_open_loop(self) -> None:
        from zgtool.latency.schedule.arrivals import ARRIVALS, check_schedule

        if self.arrivals not in ARRIVALS:
            raise UsageError(f"--arrivals must be one of {', '.join(ARRIVALS)}, not {self.arrivals!r}")
        if self.rate_rps is not None and not (0 < self.rate_rps < float("inf")):
            raise UsageError(f"--rate must be a positive number of requests per second, not {self.rate_rps:g}")
        if self.max_in_flight < 0:
            raise UsageError(f"--max-in-flight must be at least 1 (or 0 for automatic), not {self.max_in_flight}")
        if not 0 < self.sweep_point_s < float("inf"):
            raise UsageError(f"--point-s must be a positive number of seconds, not {self.sweep_point_s:g}")
        if self.schedule_s is not None:
            if len(self.schedule_s) != self.num_requests:
                raise UsageError(f"the schedule has {len(self.schedule_s)} send times for {self.num_requests} "
                                 f"requests")
            why = check_schedule(self.schedule_s)
            if why:
                raise UsageError(f"the schedule is not usable: {why}")
        if self.open_loop and self.concurrency != 1:
            raise UsageError(f"-c {self.concurrency} sets closed-loop workers; with --rate the requests in "
                             f"flight are capped by --max-in-flight instead")

    @property
    def open_loop(self) -> bool:
        return self.rate_rps is not None or self.schedule_s is not None

    @property
    def effective_rounds(self) -> int:
        return min(self.rounds or auto_rounds(self.num_requests, self.concurrency), self.num_requests)

    def public(self) -> dict[str, Any]:
        """Written into the result; the prompt text itself is summarised, not copied."""
        return {"num_requests": self.num_requests, "concurrency": self.concurrency, "warmup": self.warmup,
                "stream": self.stream, "new_connection": self.new_connection, "prompt": self.prompt_name,
                "prompt_chars": len(self.prompt), "max_tokens": self.max_tokens, "timeout_s": self.timeout_s,
                "rounds": self.effective_rounds, "confidence": self.confidence, "resamples": self.resamples,
                "seed": self.seed, "slo": self.slo.public() if self.slo else None, "quick": self.quick,
                "family_size": self.family_size, "fresh_connections": self.fresh_connections,
                "accept_encoding": self.accept_encoding,
                "open_loop": ({"rate_rps": self.rate_rps, "arrivals": self.arrivals if self.schedule_s is None
                               else "schedule", "max_in_flight": self.max_in_flight or None}
                              if self.open_loop else None),
                "workload": self.workload.public() if self.workload is not None else None}

"""What the engine hands back: per-step deltas and per-request timings/usage."""

from __future__ import annotations

from dataclasses import dataclass, field

FINISH_REASONS = ("stop", "length", "abort", "content_filter")


@dataclass(slots=True)
class RequestTimings:
    """Monotonic timestamps (time.perf_counter seconds) and phase sums in ms."""

    arrival_s: float = 0.0
    first_scheduled_s: float | None = None
    first_token_s: float | None = None
    finished_s: float | None = None
    token_times_s: list[float] = field(default_factory=list)
    prefill_ms: float = 0.0      # model time of steps that ran this request's prompt
    decode_ms: float = 0.0       # model time of steps that ran its decode tokens
    detok_ms: float = 0.0
    safety_ms: float = 0.0

    @property
    def queue_ms(self) -> float:
        if self.first_scheduled_s is None:
            return 0.0
        return (self.first_scheduled_s - self.arrival_s) * 1e3

    @property
    def ttft_ms(self) -> float | None:
        return None if self.first_token_s is None else (self.first_token_s - self.arrival_s) * 1e3

    @property
    def total_ms(self) -> float:
        end = self.finished_s if self.finished_s is not None else (self.token_times_s[-1] if self.token_times_s else self.arrival_s)
        return (end - self.arrival_s) * 1e3

    def server_timing(self) -> dict[str, float]:
        """The Server-Timing parts (ms). prefill+decode+detok+safety+queue <= total."""
        return {
            "queue": self.queue_ms,
            "prefill": self.prefill_ms,
            "decode": self.decode_ms,
            "detok": self.detok_ms,
            "safety": self.safety_ms,
            "total": self.total_ms,
        }


@dataclass(slots=True)
class Usage:
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0       # prompt tokens served from the prefix cache


@dataclass(slots=True)
class RequestOutput:
    """One delta for one request: the new tokens and text since the last delta."""

    request_id: str
    token_ids: list[int]
    text: str
    finished: bool = False
    finish_reason: str | None = None   # one of FINISH_REASONS when finished
    stop_sequence: str | None = None
    error: str | None = None           # content_filter message, abort reason

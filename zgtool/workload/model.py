"""What a workload is: per-request specs (messages, max_tokens) and, for a trace, send offsets."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from zgtool.errors import UsageError

ROLES = ("system", "user", "assistant")
Message = tuple[str, str]            # (role, content)


def bad_row(path: str, line: int, problem: str) -> UsageError:
    """The one-line error every loader raises: 'FILE:LINE: problem' (exit 2, nothing sent)."""
    return UsageError(f"--dataset {path}:{line}: {problem}")


@dataclass(frozen=True)
class RequestSpec:
    """One request of a workload: the chat messages and the output budget."""

    messages: tuple[Message, ...]
    max_tokens: int
    input_tokens: int | None = None      # a generator's requested prompt length (zgtool.workload.tokens refits it)
    reference_output: str | None = None  # ShareGPT's answer: max_tokens is its length (recounted by --tokenizer)

    def __post_init__(self) -> None:
        if not any(role == "user" for role, _ in self.messages):
            raise UsageError("a workload request needs a user message")
        if self.max_tokens < 1:
            raise UsageError(f"a workload request needs max_tokens >= 1, not {self.max_tokens}")

    @property
    def prompt_chars(self) -> int:
        return sum(len(text) for _, text in self.messages)


@dataclass(frozen=True)
class Workload:
    """A named sequence of request specs; request i of a run uses specs[i % len(specs)].

    `offsets_s` (trace replay only) holds each request's send time since the start, in seconds, already
    divided by the speed-up factor, non-decreasing."""

    kind: str                          # sharegpt | jsonl | synthetic | trace | shared-prefix | multi-turn
    name: str                          # what the user gave (file name or generator spec)
    specs: tuple[RequestSpec, ...]
    offsets_s: tuple[float, ...] | None = None
    notes: tuple[str, ...] = ()        # e.g. rows skipped as vLLM skips them

    def __post_init__(self) -> None:
        if not self.specs:
            raise UsageError(f"--dataset {self.name}: no requests in it")
        if self.offsets_s is not None:
            if len(self.offsets_s) != len(self.specs):
                raise UsageError(f"--dataset {self.name}: {len(self.offsets_s)} offsets for {len(self.specs)} requests")
            if any(b < a for a, b in zip(self.offsets_s, self.offsets_s[1:], strict=False)):
                raise UsageError(f"--dataset {self.name}: send offsets must not decrease")

    def spec(self, index: int) -> RequestSpec:
        return self.specs[index % len(self.specs)]

    def public(self) -> dict[str, Any]:
        """A summary for results (the prompts themselves are not copied)."""
        n = len(self.specs)
        out: dict[str, Any] = {
            "kind": self.kind, "name": self.name, "requests": n,
            "prompt_chars_mean": round(sum(s.prompt_chars for s in self.specs) / n, 1),
            "max_tokens_mean": round(sum(s.max_tokens for s in self.specs) / n, 1),
        }
        if self.offsets_s is not None:
            out["duration_s"] = round(self.offsets_s[-1], 3) if self.offsets_s else 0.0
        if self.notes:
            out["notes"] = list(self.notes)
        return out

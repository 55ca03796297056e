"""A request's state inside the engine (plain Python, no torch)."""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass, field

from zgtool.engine.config import SamplingParams
from zgtool.engine.outputs import RequestTimings, Usage


class Status(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


# the members as module constants: ``Status.FINISHED`` goes through the enum class's attribute
# lookup (~150 ns on Python 3.11), a global is ~20 ns; the scheduler reads them per request
WAITING, RUNNING, FINISHED = Status.WAITING, Status.RUNNING, Status.FINISHED


@dataclass(eq=False, slots=True)
class Sequence:
    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    output_filter: Callable[[str], str | None] | None = None
    tenant: str | None = None                              # the client key the scheduler shares seats by
    tenant_weight: float = 1.0                             # its tier's weight (seats in proportion)
    status: Status = Status.WAITING
    token_ids: list[int] = field(default_factory=list)     # prompt + output
    num_computed_tokens: int = 0                           # tokens whose KV is in the pool
    block_table: list[int] = field(default_factory=list)
    num_cached_blocks: int = 0                             # leading blocks registered in the prefix cache
    block_hashes: list[bytes] = field(default_factory=list)  # chain hashes of full blocks, in order
    num_preemptions: int = 0
    # its reader is far behind (engine/stream.py's backlog): the scheduler leaves it out of the
    # batch until the reader catches up. Changed only between steps (Engine._drain).
    held: bool = False
    # its reader wants the whole answer at once (a JSON answer; Engine.add_request(whole_answer=True))
    # and has no output filter or stop strings: postprocess hands out no delta before the last, which
    # carries the whole text and every output token id (emitted_chars stays behind until then)
    whole_answer: bool = False
    finish_reason: str | None = None
    stop_sequence: str | None = None
    error: str | None = None
    timings: RequestTimings = field(default_factory=RequestTimings)
    usage: Usage = field(default_factory=Usage)
    # detokenizer state
    output_text: str = ""
    emitted_chars: int = 0
    prefix_offset: int = 0
    read_offset: int = 0
    generator: object | None = None                         # torch.Generator for seeded sampling

    def __post_init__(self) -> None:
        if not self.token_ids:
            self.token_ids = list(self.prompt_token_ids)
        self.usage.prompt_tokens = len(self.prompt_token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens:]

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def is_finished(self) -> bool:
        return self.status is FINISHED

    @property
    def is_prefilling(self) -> bool:
        """More than the one new token is still to be computed (prompt, or recompute after preemption)."""
        return self.num_tokens - self.num_computed_tokens > 1

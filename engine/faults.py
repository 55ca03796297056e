"""What a failed step costs (issue 22): the requests that caused it, never the whole batch.

    SequenceFault(rows)      the model or sampler named the rows: those requests fail
    any other exception      the batch is bisected (halves run alone) down to the sequences that
                             fail by themselves; those fail. None alone (the fault needs the whole
                             batch): the step's sequences fail, not the waiting ones
    out of memory            (is_engine_wide) every running and waiting request fails
    a fault outside a step   (a scheduler bug): every running and waiting request fails

The sequences that did not fail were not advanced: the next step computes their tokens again,
writing the same KV to the same slots, so their output is what it would have been without the
failed ones. Clients hear INTERNAL_ERROR with their request id (or a SequenceFault's own
message); the traceback goes to the "zgtool.engine" log once, with the request ids.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, cast

from zgtool.engine.outputs import RequestOutput
from zgtool.engine.scheduler import ScheduledBatch, Scheduler
from zgtool.engine.sequence import Sequence

log = logging.getLogger("zgtool.engine")


def is_engine_wide(exc: BaseException) -> bool:
    """Out of host or device memory (torch.OutOfMemoryError, a RuntimeError, matched by name so
    this module needs no torch): no single request caused it, none is singled out."""
    return isinstance(exc, MemoryError) or any(t.__name__ == "OutOfMemoryError" for t in type(exc).__mro__)
INTERNAL_ERROR = "internal engine error"   # what a client hears of a fault; the log has the traceback


class Faults:
    def __init__(self, scheduler: Scheduler, runner: Any, finish: Callable[[Sequence, str], None]) -> None:
        self.scheduler = scheduler
        self.runner = runner
        self.finish = finish

    def fail(self, seqs: list[Sequence], message: str = INTERNAL_ERROR) -> list[RequestOutput]:
        """Fail these sequences alone (their blocks go back to the pool). `message` reaches the
        client with the request id: never an exception's text."""
        outs = []
        for seq in seqs:
            log.error("request %s failed in the engine step: %s", seq.request_id, message)
            self.finish(seq, "abort")
            outs.append(RequestOutput(seq.request_id, [], "", True, "abort",
                                      error=f"{message} (request {seq.request_id})"))
        return outs

    def isolate(self, batch: ScheduledBatch, exc: Exception) -> list[RequestOutput]:
        """A step raised without naming its sequences: fail the ones that fail by themselves."""
        items = list(zip(batch.seqs, batch.num_new_tokens, strict=True))
        # the trial runs must not consume seeded generators: the real step samples again later
        gens: list[tuple[Any, Any]] = [(g, g.get_state()) for s in batch.seqs
                                       if (g := cast(Any, s.generator)) is not None]
        try:
            culprits = self._bisect(items) if len(items) > 1 else []
        finally:
            for g, state in gens:
                g.set_state(state)
        failing = culprits or list(batch.seqs)
        log.error("engine step of %d sequence(s) failed (failing requests %s)", len(batch.seqs),
                  ", ".join(s.request_id for s in failing), exc_info=exc)
        return self.fail(failing)

    def _bisect(self, items: list[tuple[Sequence, int]]) -> list[Sequence]:
        """`items` failed together: run each half alone and go down into the halves that fail.
        One culprit in 32 takes 10 trial runs (one by one: 32)."""
        mid = len(items) // 2
        culprits: list[Sequence] = []
        for half in (items[:mid], items[mid:]):
            try:
                self.runner.execute(ScheduledBatch([s for s, _ in half], [n for _, n in half]))
            except Exception as exc:  # noqa: BLE001 - this half fails without the other
                if is_engine_wide(exc):
                    raise
                culprits += [half[0][0]] if len(half) == 1 else self._bisect(half)
        return culprits

    def fail_everyone(self, exc: BaseException) -> list[RequestOutput]:
        """An engine-wide fault: the traceback is logged once with the request ids; clients get a
        generic message with their request id, not the exception."""
        seqs = list(self.scheduler.running) + list(self.scheduler.waiting) + list(self.scheduler.parked)
        log.error("engine step failed; failing requests %s", ", ".join(s.request_id for s in seqs) or "(none)",
                  exc_info=exc)
        outs = []
        for seq in seqs:
            self.finish(seq, "abort")
            outs.append(RequestOutput(seq.request_id, [], "", True, "abort",
                                      error=f"{INTERNAL_ERROR} (request {seq.request_id})"))
        return outs

"""Continuous batching: waiting/running queues, a per-step token budget with chunked
prefill, a cap on running sequences, FCFS, preemption by recompute (plain Python)."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from zgtool.engine.block_manager import BlockManager
from zgtool.engine.sequence import Sequence, Status


@dataclass(slots=True)
class ScheduledBatch:
    """One step's work: each sequence with the number of tokens it computes now."""

    seqs: list[Sequence] = field(default_factory=list)
    num_new_tokens: list[int] = field(default_factory=list)
    preempted: list[Sequence] = field(default_factory=list)

    @property
    def is_empty(self) -> bool:
        return not self.seqs

    @property
    def num_tokens(self) -> int:
        return sum(self.num_new_tokens)


class Scheduler:
    def __init__(
        self,
        block_manager: BlockManager,
        max_num_seqs: int,
        max_num_batched_tokens: int,
        prefill_chunk: int | None = None,
    ) -> None:
        self.bm = block_manager
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        # deterministic mode: prompt chunks at fixed boundaries, independent of the batch
        self.prefill_chunk = prefill_chunk
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.num_preemptions = 0

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def add(self, seq: Sequence) -> None:
        seq.status = Status.WAITING
        self.waiting.append(seq)

    def _chunk(self, seq: Sequence, budget: int) -> int:
        remaining = seq.num_tokens - seq.num_computed_tokens
        n = min(remaining, budget)
        if self.prefill_chunk and remaining > 1:
            # stop at the next fixed chunk boundary so chunking never depends on the budget
            to_boundary = self.prefill_chunk - seq.num_computed_tokens % self.prefill_chunk
            n = min(remaining, to_boundary)
            if n > budget:
                return 0
        return n

    def schedule(self) -> ScheduledBatch:
        batch = ScheduledBatch()
        budget = self.max_num_batched_tokens
        # 1) running sequences first (decodes and unfinished prefills), in arrival order
        i = 0
        while i < len(self.running) and budget > 0:
            seq = self.running[i]
            n = self._chunk(seq, budget)
            if n == 0:
                i += 1
                continue
            while not self.bm.allocate(seq, n):
                # out of blocks: preempt the newest running sequence (recompute later)
                victim = self.running[-1]
                self._preempt(victim, batch)
                if victim is seq:
                    break
            else:
                batch.seqs.append(seq)
                batch.num_new_tokens.append(n)
                budget -= n
                i += 1
                continue
            # seq itself was preempted; the list shrank, do not advance i
        # 2) admit waiting sequences FCFS while budget, seats and blocks last
        while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs:
            seq = self.waiting[0]
            if not seq.block_table:
                align = self.prefill_chunk or 1
                self.bm.match_prefix(seq, align_tokens=align)
            n = self._chunk(seq, budget)
            if n == 0 or not self.bm.allocate(seq, n):
                # A waiting sequence holds no blocks it cannot run with: the prefix it attached
                # goes back (still cached, evictable). Kept, such blocks piled up across
                # preemptions until waiting sequences held the whole pool and nothing ran (issue 22).
                if seq.block_table:
                    self.bm.free_seq(seq)
                break
            self.waiting.popleft()
            seq.status = Status.RUNNING
            self.running.append(seq)
            batch.seqs.append(seq)
            batch.num_new_tokens.append(n)
            budget -= n
        return batch

    def _preempt(self, seq: Sequence, batch: ScheduledBatch) -> None:
        self.running.remove(seq)
        if seq in batch.seqs:
            j = batch.seqs.index(seq)
            batch.seqs.pop(j)
            batch.num_new_tokens.pop(j)
        self.bm.free_seq(seq)
        seq.status = Status.WAITING
        seq.num_preemptions += 1
        self.num_preemptions += 1
        batch.preempted.append(seq)
        self.waiting.appendleft(seq)

    def finish(self, seq: Sequence, reason: str) -> None:
        """Finish or abort a sequence wherever it is; its blocks go back to the pool."""
        if seq.status is Status.FINISHED:
            return
        if seq in self.running:
            self.running.remove(seq)
        else:
            try:
                self.waiting.remove(seq)
            except ValueError:
                pass
        self.bm.free_seq(seq)
        seq.status = Status.FINISHED
        seq.finish_reason = reason

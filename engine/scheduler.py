"""Continuous batching: waiting/running queues, a per-step token budget with chunked
prefill, a cap on running sequences, preemption by recompute (plain Python).

Seats are shared between client keys (``Sequence.tenant``, weighted by ``tenant_weight``):
the next waiting sequence admitted is the oldest of the key with the fewest running
sequences per unit of weight, and when the batch is full a key below its quota
(``max_num_seqs`` split in proportion to the weights of the keys with work) takes a seat from
a key above its own, whose newest sequence is preempted. One key filling every seat pushed
another key's first token back until one of its long streams ended (issue 22: ~10 ms -> 18-20 s
of TTFT); now it is admitted in the next step. Sequences of one key (or none) stay FCFS.

A held sequence (``hold``: its stream's reader is far behind, engine/stream.py) is left out of the
batch; when a waiting sequence needs a seat or KV blocks, held ones give theirs first (preempted and
parked: not waiting until let go, then first in line), before any sequence that is computing.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from zgtool.engine.block_manager import BlockManager
from zgtool.engine.sequence import FINISHED, RUNNING, WAITING, Sequence


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
        self.num_held = 0           # running sequences left out of the batch for their reader (hold())
        # held sequences whose seat and blocks went to others: not waiting for a seat until let go
        self.parked: list[Sequence] = []
        self._live_keys: dict[str | None, int] = {}     # client key -> its waiting + running sequences

    @property
    def num_live_keys(self) -> int:
        return len(self._live_keys)

    @property
    def has_work(self) -> bool:
        """Anything a step could compute: a held sequence waits for its reader, not for a step."""
        return bool(self.waiting) or len(self.running) > self.num_held

    def hold(self, seq: Sequence, held: bool) -> None:
        """Leave a sequence out of the batch (held) or put it back, between steps. Its reader has not
        taken its earlier tokens (backpressure: engine/stream.py), so computing more would only queue
        them in memory. A held sequence keeps its seat and KV blocks until a waiting sequence needs
        them: then it is preempted and parked (no seat, no blocks, not waiting); let go, it is first
        in line again and recomputes what it had."""
        if seq.held is held or seq.status is FINISHED:
            return
        seq.held = held
        if seq.status is RUNNING:
            self.num_held += 1 if held else -1
        elif held:
            try:
                self.waiting.remove(seq)     # preempted before its hold arrived: parked instead
            except ValueError:
                return
            self.parked.append(seq)
        elif seq in self.parked:
            self.parked.remove(seq)
            self.waiting.appendleft(seq)

    def _held_victim(self) -> Sequence | None:
        """The newest held running sequence (its seat and blocks serve no reader now), or None."""
        if self.num_held:
            for s in reversed(self.running):
                if s.held:
                    return s
        return None

    def add(self, seq: Sequence) -> None:
        seq.status = WAITING
        self.waiting.append(seq)
        self._live_keys[seq.tenant] = self._live_keys.get(seq.tenant, 0) + 1

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
        batch = ScheduledBatch([], [], [])
        seqs, num_new = batch.seqs, batch.num_new_tokens
        budget = self.max_num_batched_tokens
        allocate = self.bm.allocate
        bs = self.bm.block_size
        # 1) running sequences first (decodes and unfinished prefills), in arrival order
        i = 0
        running = self.running
        any_held = self.num_held > 0
        while i < len(running) and budget > 0:
            seq = running[i]
            if any_held and seq.held:
                i += 1
                continue
            computed = seq.num_computed_tokens
            if len(seq.token_ids) - computed == 1:
                # a decode (one token left to compute, budget > 0) takes 1 whatever the chunking;
                # inside its last block it needs no new block (allocate's answer, without the call)
                n = 1
                fits = computed < len(seq.block_table) * bs
            else:
                n = self._chunk(seq, budget)
                if n == 0:
                    i += 1
                    continue
                fits = False
            if not fits:
                while not allocate(seq, n):
                    # out of blocks: preempt a held sequence, else the newest running one (recompute later)
                    victim = self._held_victim() or running[-1]
                    before_seq = victim is not running[-1] and running.index(victim) < i
                    self._preempt(victim, batch)
                    if victim is seq:
                        break
                    if before_seq:
                        i -= 1      # the list shrank before seq: keep i on it
                else:
                    fits = True
                if not fits:
                    continue    # seq itself was preempted; the list shrank, do not advance i
            seqs.append(seq)
            num_new.append(n)
            budget -= n
            i += 1
        # 2) admit waiting sequences while budget, seats and blocks last, sharing seats by key
        waiting = self.waiting
        while waiting and budget > 0:
            seq = waiting[0] if len(self._live_keys) <= 1 else self._next_waiting()
            if len(running) >= self.max_num_seqs:
                donor = self._held_victim() or self._seat_donor(seq)   # a held seat first: it serves nobody
                if donor is None:
                    break
                budget += self._preempt(donor, batch)
            if not seq.block_table:
                self.bm.match_prefix(seq, align_tokens=self.prefill_chunk or 1)
            n = self._chunk(seq, budget)
            ok = n > 0 and allocate(seq, n)
            while not ok and n > 0 and (parked := self._held_victim()) is not None:
                self._preempt(parked, batch)    # held blocks go to a sequence that will use them
                ok = allocate(seq, n)
            if not ok:
                # A waiting sequence holds no blocks it cannot run with: the prefix it attached
                # goes back (still cached, evictable). Kept, such blocks piled up across
                # preemptions until waiting sequences held the whole pool and nothing ran (issue 22).
                if seq.block_table:
                    self.bm.free_seq(seq)
                break
            if seq is waiting[0]:
                waiting.popleft()
            else:
                waiting.remove(seq)
            seq.status = RUNNING
            running.append(seq)
            seqs.append(seq)
            num_new.append(n)
            budget -= n
        return batch

    # -- sharing seats between keys ----------------------------------------
    def _next_waiting(self) -> Sequence:
        """The oldest waiting sequence of the key with the fewest running sequences per unit of
        weight (ties: the key whose oldest waiting sequence is older). One key: the queue's head."""
        head = self.waiting[0]
        if len(self._live_keys) <= 1:
            return head
        firsts: dict[str | None, Sequence] = {}
        for s in self.waiting:
            if s.tenant not in firsts:
                firsts[s.tenant] = s
        if len(firsts) == 1:
            return head
        counts = self._running_per_key()
        best = head
        best_load = counts.get(head.tenant, 0) / head.tenant_weight
        for key, s in firsts.items():
            load = counts.get(key, 0) / s.tenant_weight
            if load < best_load:
                best, best_load = s, load
        return best

    def _running_per_key(self) -> dict[str | None, int]:
        counts: dict[str | None, int] = {}
        for s in self.running:
            counts[s.tenant] = counts.get(s.tenant, 0) + 1
        return counts

    def _quotas(self) -> dict[str | None, int]:
        """Seats per key with work: max_num_seqs in proportion to the weights, at least 1."""
        weights: dict[str | None, float] = {}
        for s in self.running:
            weights.setdefault(s.tenant, s.tenant_weight)
        for s in self.waiting:
            weights.setdefault(s.tenant, s.tenant_weight)
        total = sum(weights.values())
        return {k: max(1, int(self.max_num_seqs * w / total)) for k, w in weights.items()}

    def _seat_donor(self, seq: Sequence) -> Sequence | None:
        """The batch is full: the running sequence to preempt so `seq` gets a seat, or None.
        Only a key below its quota takes a seat, and only from a key above its own (the newest
        sequence of the key furthest above): seats never ping-pong between keys."""
        if len(self._live_keys) <= 1:
            return None
        quotas = self._quotas()
        counts = self._running_per_key()
        if counts.get(seq.tenant, 0) >= quotas[seq.tenant]:
            return None
        over = {k: n - quotas[k] for k, n in counts.items() if n > quotas[k]}
        if not over:
            return None
        key = max(over, key=lambda k: over[k])
        return next(s for s in reversed(self.running) if s.tenant == key)

    def _preempt(self, seq: Sequence, batch: ScheduledBatch) -> int:
        """Back to the head of the waiting queue, its blocks freed (recomputed when it runs
        again). Returns the tokens it had been given in this step's batch (0 if none)."""
        self.running.remove(seq)
        given = 0
        if seq in batch.seqs:
            j = batch.seqs.index(seq)
            batch.seqs.pop(j)
            given = batch.num_new_tokens.pop(j)
        self.bm.free_seq(seq)
        seq.status = WAITING
        seq.num_preemptions += 1
        self.num_preemptions += 1
        batch.preempted.append(seq)
        if seq.held:
            self.num_held -= 1
            self.parked.append(seq)     # not waiting for a seat until its reader catches up
        else:
            self.waiting.appendleft(seq)
        return given

    def finish(self, seq: Sequence, reason: str) -> None:
        """Finish or abort a sequence wherever it is; its blocks go back to the pool."""
        if seq.status is FINISHED:
            return
        if seq.held:
            if seq.status is RUNNING:
                self.num_held -= 1
            seq.held = False
        try:
            self.running.remove(seq)    # one scan of the batch (not `in`, then remove)
        except ValueError:
            try:
                self.waiting.remove(seq)
            except ValueError:
                if seq in self.parked:
                    self.parked.remove(seq)
        self.bm.free_seq(seq)
        seq.status = FINISHED
        seq.finish_reason = reason
        left = self._live_keys.get(seq.tenant, 0) - 1
        if left > 0:
            self._live_keys[seq.tenant] = left
        else:
            self._live_keys.pop(seq.tenant, None)

"""Open-loop dispatch: each request is sent when its schedule says, not when a worker is free.

A closed loop (-c workers) waits for an answer before it sends the next request, so a slow server
slows the offered load down and hides its own queue (coordinated omission). Here the calling thread
is the dispatcher: it sleeps until each send offset and hands the request to a pool of worker
threads, each owning one keep-alive Session to the target. OPEN_LOOP_PRESPAWN idle workers are
started before a block's clock; the pool grows on demand (one spare kept ahead of the next send,
so a slow answer never delays a send) up to `max_in_flight`; a request due while every worker is
busy and the pool is at that bound waits in the queue and is marked `waited_for_worker`.

Threads share one GIL: a client starved of CPU answers slower, the pool grows and the threads
contend, so past its capacity the client falls behind steeply. That is what the flag is for
(bench/client_capacity.py measures where it happens).

Every sample records when it was due (`scheduled_s`), how late it left (`dispatch_lag_ms`) and its
latency counted from when it was due (`total_from_scheduled_ms`, `ttft_from_scheduled_ms`) beside
the usual figures counted from the actual send. zgtool.latency.analysis.openloop judges whether the
client kept its schedule.
"""

from __future__ import annotations

import collections
import queue
import ssl
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from time import perf_counter_ns
from typing import TYPE_CHECKING

from zgtool.latency.config import SplitConfig
from zgtool.latency.records import RequestSample
from zgtool.latency.schedule.arrivals import arrival_offsets_s, block_schedule

if TYPE_CHECKING:
    from zgtool.latency.records import RequestHook
    from zgtool.latency.wire.client import Endpoint, Session

_Job = tuple[int, int, int, bool, list[RequestSample]]     # index, round, due (ns), waited, where its sample goes

OPEN_LOOP_MAX_IN_FLIGHT = 256     # default bound of the worker pool (threads, connections)
OPEN_LOOP_PRESPAWN = 16           # idle workers started before a block's clock (k6's preAllocatedVUs)
# a waiting dispatcher takes the GIL back from a busy worker within this (Python's default is 5 ms)
DISPATCH_SWITCH_INTERVAL_S = 0.0005


@dataclass
class DispatchRecord:
    """What the dispatcher saw for one target, summed over its blocks."""

    blocks: int = 0
    wall_s: float = 0.0             # the blocks' wall time, first send due -> last answer
    cpu_s: float = 0.0              # this process's CPU time (all threads) over the same time
    workers_max: int = 0            # the pool's largest size (OPEN_LOOP_PRESPAWN started idle)
    in_flight_max: int = 0          # most requests being sent or answered at once (queued ones not counted)
    max_in_flight: int = 0


@dataclass
class OpenLoopLog:
    """Filled by measure_targets in an open-loop run: one record per target name.

    `before_send` runs in the dispatcher just before each hand-off: a seam for tests that need a
    client which falls behind (a CPU hog), never used by the command."""

    records: dict[str, DispatchRecord] = field(default_factory=dict)
    before_send: Callable[[], None] | None = None


def _apply_schedule(sample: RequestSample, due_ns: int, t_run0_ns: int, waited: bool) -> None:
    sample.scheduled_s = (due_ns - t_run0_ns) / 1e9
    lag_ms = (sample.start_s - sample.scheduled_s) * 1e3
    # counted to when the request's first byte left (the kernel's send time), less the network's own set-up
    # (DNS, connect, TLS): a client that slipped between its start and the send is late too (issue 38);
    # total/ttft already count from the start, so they add the start's lag only
    slip_ms = 0.0
    if sample.first_byte_out_ms is not None:
        setup = sum(v for v in (sample.dns_ms, sample.connect_ms, sample.tls_ms) if v is not None)
        slip_ms = max(0.0, sample.first_byte_out_ms - setup)
    sample.dispatch_lag_ms = lag_ms + slip_ms
    sample.waited_for_worker = waited
    if sample.total_ms is not None:
        sample.total_from_scheduled_ms = sample.total_ms + lag_ms
    if sample.ttft_ms is not None:
        sample.ttft_from_scheduled_ms = sample.ttft_ms + lag_ms


class WorkerPool:
    """Worker threads for one target; each owns one Session. A request goes to the worker that went idle
    last (a stack, as a connection pool hands out its warmest connection), so at a rate the first worker
    keeps up with, one keep-alive connection carries every request instead of each idle worker opening
    its own (and the server closing them idle between uses); with no worker idle it waits in the backlog
    for the first worker to free up."""

    def __init__(self, make_session: Callable[[], Session], max_in_flight: int, t_run0_ns: int,
                 hook: RequestHook | None = None) -> None:
        self.make_session = make_session
        self.max_in_flight = max_in_flight
        self.t_run0_ns = t_run0_ns
        self.hook = hook
        self.inboxes: list[queue.SimpleQueue[_Job | None]] = []
        self.idle: list[int] = []     # idle workers, the one idle the shortest last
        self.backlog: collections.deque[_Job] = collections.deque()
        self.cv = threading.Condition()
        self.free = 0                 # workers not holding a job (negative: jobs queued)
        self.pending = 0              # jobs handed off and not yet answered
        self.pending_max = 0
        self.ready = 0                # workers whose session exists (waiting for jobs)
        self.failure: BaseException | None = None   # a bug in a worker: re-raised by wait_idle
        self.threads: list[threading.Thread] = []

    @property
    def size(self) -> int:
        return len(self.threads)

    def _spawn(self) -> None:       # caller holds self.cv
        self.inboxes.append(queue.SimpleQueue())
        t = threading.Thread(target=self._work, args=(len(self.threads),), daemon=True,
                             name=f"zgtool-openloop-{len(self.threads)}")
        self.threads.append(t)
        self.free += 1
        t.start()

    def ensure(self, n: int) -> None:
        """At least min(n, max_in_flight) workers, each started and waiting for a job."""
        with self.cv:
            while self.size < min(n, self.max_in_flight):
                self._spawn()
            while self.ready < self.size:
                self.cv.wait()

    def submit(self, index: int, rnd: int, due_ns: int, out: list[RequestSample]) -> bool:
        """Hand one request to a worker; True when every worker was busy (it waits in the queue)."""
        with self.cv:
            waited = self.free <= 0 and self.size >= self.max_in_flight
            spawn = self.free <= 0 and not waited
            self.free -= 1
            self.pending += 1
            busy = min(self.pending, self.size)      # the rest wait in the queue
            self.pending_max = max(self.pending_max, busy)
            job = (index, rnd, due_ns, waited, out)
            worker = self.idle.pop() if self.idle else None
            if worker is None:
                self.backlog.append(job)
        if worker is not None:
            self.inboxes[worker].put(job)
        if spawn:      # after the hand-off: a worker that frees up meanwhile takes it first
            self.top_up()
        return waited

    def top_up(self) -> None:
        """Keep one idle worker ahead of the next send (thread start-up stays off the send path)."""
        with self.cv:
            if self.free <= 0 and self.size < self.max_in_flight:
                self._spawn()

    def wait_idle(self) -> None:
        """Until every handed-off request is answered; a worker's unexpected exception is raised here."""
        with self.cv:
            while self.pending:
                self.cv.wait()
            if self.failure is not None:
                raise self.failure

    def _next(self, worker: int) -> _Job | None:
        """The backlog's first job, else this worker goes on the idle stack and waits for its own."""
        with self.cv:
            if self.backlog:
                return self.backlog.popleft()
            self.idle.append(worker)
        return self.inboxes[worker].get()

    def _work(self, worker: int) -> None:
        session = self.make_session()
        with self.cv:
            self.ready += 1
            self.cv.notify_all()
        try:
            while (job := self._next(worker)) is not None:
                index, rnd, due_ns, waited, out = job
                try:
                    token = self.hook.before() if self.hook is not None else None
                    sample = session.measure(index, worker, rnd, self.t_run0_ns)
                    if self.hook is not None:
                        self.hook.after(token, sample)
                    _apply_schedule(sample, due_ns, self.t_run0_ns, waited)
                except BaseException as exc:   # not a failed request (those are samples): a bug
                    with self.cv:
                        self.failure = self.failure or exc
                        self.pending -= 1
                        self.cv.notify_all()
                    return
                with self.cv:
                    out.append(sample)
                    self.free += 1
                    self.pending -= 1
                    if not self.pending:
                        self.cv.notify_all()
        finally:
            session.close()

    def close(self) -> None:
        for inbox in self.inboxes:
            inbox.put(None)
        for t in self.threads:
            t.join()


def run_block(pool: WorkerPool, first_index: int, offsets_s: Sequence[float], rnd: int,
              out: list[RequestSample], record: DispatchRecord,
              before_send: Callable[[], None] | None = None) -> None:
    """Send len(offsets_s) requests, request k at block start + offsets_s[k], and wait for every answer."""
    old_interval = sys.getswitchinterval()
    sys.setswitchinterval(min(old_interval, DISPATCH_SWITCH_INTERVAL_S))
    pool.ensure(OPEN_LOOP_PRESPAWN)
    cpu0 = time.process_time()
    t0 = perf_counter_ns()
    try:
        for k, off in enumerate(offsets_s):
            due = t0 + round(off * 1e9)
            wait_ns = due - perf_counter_ns()
            if wait_ns > 0:
                time.sleep(wait_ns / 1e9)
            if before_send is not None:
                before_send()
            pool.submit(first_index + k, rnd, due, out)
            pool.top_up()
        pool.wait_idle()
    finally:
        sys.setswitchinterval(old_interval)
    record.blocks += 1
    record.wall_s += (perf_counter_ns() - t0) / 1e9
    record.cpu_s += time.process_time() - cpu0
    record.workers_max = max(record.workers_max, pool.size)
    record.in_flight_max = max(record.in_flight_max, pool.pending_max)
    record.max_in_flight = pool.max_in_flight


def block_seed(seed: int, rnd: int) -> int:
    """One Poisson draw per round, shared by every target of that round: the paired comparison sees
    the same arrival pattern on each path."""
    return seed * 1_000_003 + rnd


class OpenLoop:
    """The open-loop side of measure_targets: one worker pool per target, kept across its blocks."""

    def __init__(self, endpoints: Sequence[Endpoint], names: Sequence[str], cfg: SplitConfig,
                 ctx: ssl.SSLContext | None, t_run0_ns: int, hooks: Sequence[RequestHook | None] | None,
                 log: OpenLoopLog | None) -> None:
        from zgtool.latency.wire.client import Session

        self.cfg = cfg
        self.names = names
        self.log = log if log is not None else OpenLoopLog()
        limit = cfg.max_in_flight or OPEN_LOOP_MAX_IN_FLIGHT
        self.pools = [WorkerPool(lambda ep=ep: Session(ep, cfg, ctx), limit, t_run0_ns,  # type: ignore[misc]
                                 hooks[i] if hooks else None) for i, ep in enumerate(endpoints)]

    def offsets(self, first_index: int, count: int, rnd: int) -> tuple[float, ...]:
        cfg = self.cfg
        if cfg.schedule_s is not None:
            return block_schedule(cfg.schedule_s[first_index:first_index + count])
        assert cfg.rate_rps is not None
        return arrival_offsets_s(count, cfg.rate_rps, cfg.arrivals, block_seed(cfg.seed, rnd))

    def run_block(self, ti: int, first_index: int, count: int, rnd: int, out: list[RequestSample]) -> None:
        record = self.log.records.setdefault(self.names[ti], DispatchRecord())
        run_block(self.pools[ti], first_index, self.offsets(first_index, count, rnd), rnd, out, record,
                  self.log.before_send)

    def close(self) -> None:
        for pool in self.pools:
            pool.close()

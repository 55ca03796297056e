"""The Engine: owns the model runner, block pool and scheduler; admits requests; steps.

A step is three stages, one file each: schedule (scheduler.py: seats shared by client key, KV
blocks from block_manager.py), execute (runner.py; a failure costs only the requests that cause
it, faults.py), postprocess (postprocess.py: EOS, detok, safety, stops, length, timings).

Once start()ed, a step driver (engine/drivers.py, chosen by the backend) calls step(): a step
thread that hands outputs back to the asyncio loop once per step for every engine that computes,
the loop itself for the null backend. Unstarted, generate()/iter_generate() step in the caller.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import itertools
import logging
import math
import os
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from zgtool.engine import kvpool
from zgtool.engine.block_manager import BlockManager
from zgtool.engine.config import EngineConfig, SamplingParams
from zgtool.engine.detok import emittable
from zgtool.engine.drivers import LoopStepper, StepThread, choose_driver
from zgtool.engine.errors import (
    ContextLengthExceeded,
    EngineStopped,
    InvalidRequest,
    Overloaded,
    SequenceFault,
)
from zgtool.engine.faults import Faults, is_engine_wide
from zgtool.engine.null_runner import NULL_MODEL, NullRunner, null_device, null_tokenizer
from zgtool.engine.outputs import RequestOutput, RequestTimings, Usage
from zgtool.engine.postprocess import Postprocessor
from zgtool.engine.scheduler import Scheduler
from zgtool.engine.sequence import FINISHED, Sequence
from zgtool.engine.stream import RequestStream
from zgtool.engine.tokenizer import Tokenizer

if TYPE_CHECKING:
    from zgtool.engine.model import LlamaModel
    from zgtool.engine.presets import ModelSpec

log = logging.getLogger("zgtool.engine")


@dataclass
class GenerateResult:
    request_id: str
    prompt_token_ids: list[int]
    output_token_ids: list[int]
    text: str
    finish_reason: str | None
    timings: RequestTimings
    usage: Usage
    error: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)


class Engine:
    # set by _load_null or _load_model
    tokenizer: Tokenizer
    spec: ModelSpec | None
    model: LlamaModel | None
    runner: Any

    def __init__(self, config: EngineConfig | None = None) -> None:
        self.config = cfg = config or EngineConfig()
        self.block_size = cfg.block_size
        if cfg.model == NULL_MODEL:
            self._load_null(cfg)
        else:
            self._load_model(cfg)
        self.eos_token_ids = set(self.tokenizer.eos_token_ids)
        self._vocab_size = self.spec.vocab_size if self.spec else self.tokenizer.vocab_size
        self.block_manager = BlockManager(self.num_kv_blocks, cfg.block_size, cfg.enable_prefix_caching)
        # deterministic: fixed chunk boundaries, never wider than a step (a wider one never ran)
        chunk = min(max(cfg.block_size, 64), cfg.max_num_batched_tokens) if cfg.deterministic else None
        self.scheduler = Scheduler(self.block_manager, cfg.max_num_seqs, cfg.max_num_batched_tokens, chunk)
        self.faults = Faults(self.scheduler, self.runner, self._finish)
        self.postprocess = Postprocessor(self.tokenizer, self.eos_token_ids, self.block_manager, self._finish,
                                         self.faults.fail)
        self._seqs: dict[str, Sequence] = {}
        self._streams: dict[str, RequestStream] = {}
        self._inbox: deque[Sequence] = deque()
        self._aborts: deque[str] = deque()
        self._holds: deque[tuple[Sequence, bool]] = deque()   # (sequence, held) from its stream
        self._admin: deque[tuple[Callable[[], Any], concurrent.futures.Future[Any]]] = deque()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._driver: StepThread | LoopStepper | None = None   # engine/drivers.py, set by start()
        self.accepting = True
        self._ids = itertools.count()
        self._max_waiting = cfg.max_waiting
        self._batch_window_s = cfg.batch_window_ms / 1e3
        self.num_steps = 0
        self.num_step_seqs = 0     # sequences computed, summed over the steps: / num_steps = the mean batch
        # progress watch (/health, zg_engine_stalled_seconds): when a step last began or ended with
        # work, and when work last arrived at an idle engine
        self.last_progress_s = self.last_idle_s = time.perf_counter()
        self.finished_by_reason: dict[str, int] = {}
        self.num_stuck_steps = 0        # steps that had work and scheduled none (see _note_stuck)
        self.num_stuck_episodes = 0     # runs of such steps
        self._stuck = False
        self.last_step_ms = 0.0
        self._pending: list[RequestOutput] = []
        self.last_request_timings = RequestTimings()

    def _load_null(self, cfg: EngineConfig) -> None:
        """The null backend (engine/null_runner.py): real bookkeeping, no tensors, no torch."""
        device = null_device(cfg.device)
        if device is None:      # --device cuda by name: there must be one
            import torch

            device = kvpool.pick_device_dtype(cfg, torch)[0]
        self.device, self.dtype = device, "none"
        self.model_name = cfg.model
        self.tokenizer = null_tokenizer()
        self.is_dummy = False
        self.spec = None
        self.max_model_len = cfg.max_model_len or 4096
        self.num_kv_blocks = kvpool.null_blocks(cfg, self.max_model_len)
        self.kv_bytes_per_block = 0
        self.model = None
        self.runner = NullRunner()

    def _load_model(self, cfg: EngineConfig) -> None:
        """A model with weights (packaged, a directory or dummy:<preset>) and the device's runner."""
        import torch

        from zgtool.engine.model import LlamaModel
        from zgtool.engine.runner import make_runner, weights_oom
        from zgtool.engine.weights import load_model

        self.device, self.dtype, torch_dtype = kvpool.pick_device_dtype(cfg, torch)
        # cast per tensor: no fp32 copy; on CUDA a dummy model's weights are made on the device
        try:
            loaded = load_model(cfg.model, seed=cfg.seed, dtype=torch_dtype, device=self.device)
        except torch.OutOfMemoryError:
            raise weights_oom(cfg.model, self.device) from None
        if cfg.num_threads:
            torch.set_num_threads(cfg.num_threads)
        elif loaded.spec.hidden_size <= 256:
            # tiny GEMMs: OpenMP fork/join costs more than it saves and spins against the I/O loop
            torch.set_num_threads(1)
        self.model_name = cfg.model
        self.tokenizer = loaded.tokenizer
        self.is_dummy = loaded.is_dummy
        self.spec = spec = loaded.spec
        self.max_model_len = min(cfg.max_model_len or spec.max_position_embeddings, spec.max_position_embeddings)
        try:
            self.model = LlamaModel(spec, loaded.weights, torch.device(self.device), torch_dtype, cfg.deterministic)
        except torch.OutOfMemoryError:
            raise weights_oom(cfg.model, self.device) from None
        del loaded
        self.kv_bytes_per_block = self.model.kv_bytes_per_block(cfg.block_size)
        self.num_kv_blocks = kvpool.num_blocks(cfg, self.kv_bytes_per_block, self.max_model_len, torch)
        # the device's runner, chosen once; it allocates the KV pool (a CUDA runner's pad block too)
        self.runner = make_runner(self.model, cfg, self.num_kv_blocks, self.max_model_len)

    # -- admission into the engine -----------------------------------------
    def validate(self, prompt_token_ids: list[int], params: SamplingParams) -> None:
        if not self.accepting:
            raise EngineStopped("the engine is shutting down")
        if not prompt_token_ids:
            raise InvalidRequest("prompt is empty")
        n = len(prompt_token_ids)
        if n >= self.max_model_len or n + params.max_tokens > self.max_model_len:
            raise ContextLengthExceeded(n, params.max_tokens, self.max_model_len)
        vocab = self._vocab_size
        if min(prompt_token_ids) < 0 or max(prompt_token_ids) >= vocab:
            raise InvalidRequest(f"prompt has token ids outside the vocabulary [0, {vocab})")
        blocks = -(-(n + params.max_tokens) // self.block_size)
        if blocks > self.num_kv_blocks:
            raise InvalidRequest(f"request needs {blocks} KV blocks, the pool has {self.num_kv_blocks}")
        if len(self.scheduler.waiting) + len(self._inbox) >= self._max_waiting:
            raise Overloaded("the waiting queue is full")

    def _new_seq(self, prompt_token_ids: list[int], params: SamplingParams, request_id: str | None,
                 output_filter: Callable[[str], str | None] | None, tenant: str | None = None,
                 tenant_weight: float = 1.0, whole_answer: bool = False) -> Sequence:
        if not isinstance(params, SamplingParams):
            raise InvalidRequest("params must be a SamplingParams")
        self.validate(prompt_token_ids, params)     # reads only; Sequence copies the list
        rid = request_id or os.urandom(12).hex()   # 24 random hex digits, like uuid4().hex[:24] at a sixth of its CPU
        if rid in self._seqs:
            raise InvalidRequest(f"request id {rid!r} is already in use")
        if not (isinstance(tenant_weight, (int, float)) and 0 < tenant_weight < math.inf):
            raise InvalidRequest(f"tenant_weight must be a positive number, got {tenant_weight!r}")
        seq = Sequence(rid, list(prompt_token_ids), params, output_filter, tenant, float(tenant_weight))
        # one delta at the end needs nothing held back: a filter's verdict or a stop string decides
        # per delta what the reader has already been handed, so those still go delta by delta
        seq.whole_answer = whole_answer and output_filter is None and not params.stop
        seq.timings.arrival_s = time.perf_counter()
        if params.seed is not None and not params.greedy and self.model is not None:
            from zgtool.engine.sampling import make_generator

            seq.generator = make_generator(params, self.model.device)
        return seq

    def add_request(self, prompt_token_ids: list[int], params: SamplingParams, *, request_id: str | None = None,
                    output_filter: Callable[[str], str | None] | None = None,
                    step_now: bool = False, tenant: str | None = None,
                    tenant_weight: float = 1.0, whole_answer: bool = False) -> RequestStream:
        """Queue a request for the step thread (call on the event loop thread after start()).

        ``tenant``/``tenant_weight``: the client key and its tier's weight; running seats are
        shared between keys in proportion to the weights (engine/scheduler.py). None: one
        shared key (first come, first served).

        ``step_now``: the caller knows no other request is about to arrive (nothing to batch
        with); on the loop driver, an idle engine then takes this request's first step at once,
        in the caller, instead of one loop iteration later.

        ``whole_answer``: the caller reads only the finished answer (a JSON response): the stream
        wakes its reader once (RequestStream.wake_on_finish), and, without an output filter or
        stop strings, no delta is handed out before the last, which carries the whole text and
        every output token id (Sequence.whole_answer; an abort's or a failure's last delta carries
        no ids, as on any stream)."""
        seq = self._new_seq(prompt_token_ids, params, request_id, output_filter, tenant, tenant_weight,
                            whole_answer)
        stream = RequestStream(seq, self._loop, self._hold)
        stream.wake_on_finish = whole_answer
        self._seqs[seq.request_id] = seq
        self._streams[seq.request_id] = stream
        self._inbox.append(seq)
        if self._driver is not None:
            self._driver.arrived(step_now)
        return stream

    def _hold(self, seq: Sequence, held: bool) -> None:
        """engine/stream.py's backpressure, on the loop thread: the change takes effect between two
        steps (Engine._drain); letting a sequence go wakes an engine that had nothing else to run."""
        self._holds.append((seq, held))
        if not held and self._driver is not None:
            self._driver.arrived(False)

    def abort(self, request_id: str) -> None:
        self._aborts.append(request_id)
        if self._driver is not None:
            self._driver.arrived(False)

    # -- the step ---------------------------------------------------------
    def _drain(self) -> None:
        while self._inbox:
            self.scheduler.add(self._inbox.popleft())
        while self._aborts:
            seq = self._seqs.get(self._aborts.popleft())
            if seq is not None and not seq.is_finished:
                self._finish(seq, "abort")
                self._pending.append(RequestOutput(seq.request_id, [], emittable(seq, True), True, "abort"))
        while self._holds:
            self.scheduler.hold(*self._holds.popleft())
        while self._admin:
            fn, fut = self._admin.popleft()
            try:
                fut.set_result(fn())
            except Exception as exc:  # noqa: BLE001 - handed to the caller
                fut.set_exception(exc)

    def _finish(self, seq: Sequence, reason: str) -> None:
        self.scheduler.finish(seq, reason)
        seq.timings.finished_s = time.perf_counter()
        seq.usage.completion_tokens = len(seq.token_ids) - len(seq.prompt_token_ids)    # num_output_tokens
        self.finished_by_reason[reason] = self.finished_by_reason.get(reason, 0) + 1

    def step(self) -> list[RequestOutput]:
        """One iteration: schedule, execute, postprocess (engine/postprocess.py). Returns the
        deltas it produced (aborts drained before it included)."""
        sched = self.scheduler
        if not (sched.waiting or len(sched.running) > sched.num_held):    # not sched.has_work, inlined
            self.last_idle_s = time.perf_counter()
        if self._inbox or self._aborts or self._admin or self._holds:
            self._pending = []
            self._drain()
            outputs = self._pending
        else:
            outputs = self._pending = []
        batch = sched.schedule()
        if not batch.seqs:
            if sched.has_work:     # work pending (held sequences wait for their readers), nothing could run
                self._note_stuck()
            return outputs
        self._stuck = False
        sampled, step_ms, failed = self._execute(batch)
        if failed is not None:
            return outputs + failed
        done = self.postprocess(batch, sampled, step_ms)
        return outputs + done if outputs else done

    def _note_stuck(self) -> None:
        """A step with work pending that scheduled nothing (never expected: the scheduler admits any
        request that fits the pool alone, and add_request rejects one that cannot). Counted for
        /metrics; logged once per episode."""
        self.num_stuck_steps += 1
        if not self._stuck:
            self._stuck = True
            self.num_stuck_episodes += 1
            log.error("engine scheduled nothing with %d waiting and %d running (KV %d/%d blocks used)",
                      len(self.scheduler.waiting), len(self.scheduler.running),
                      self.block_manager.num_used_blocks, self.block_manager.num_blocks)

    def _execute(self, batch: Any) -> tuple[list[int | None], float, list[RequestOutput] | None]:
        """Run the model on a batch: (sampled tokens, step ms, None), or the outputs of the requests
        failed when the step raised for some of its sequences (the rest are recomputed next step)."""
        t0 = time.perf_counter()
        self.last_progress_s = t0
        for seq in batch.seqs:
            tm = seq.timings
            if tm.first_scheduled_s is None:
                tm.first_scheduled_s = t0
        try:
            sampled = self.runner.execute(batch)
        except SequenceFault as fault:
            return [], 0.0, self.faults.fail([batch.seqs[i] for i in fault.rows], fault.message)
        except Exception as exc:  # noqa: BLE001 - find the sequence(s) that cause it
            if is_engine_wide(exc):
                raise
            return [], 0.0, self.faults.isolate(batch, exc)
        t1 = time.perf_counter()
        step_ms = (t1 - t0) * 1e3
        self.last_step_ms = step_ms
        self.last_progress_s = t1
        self.num_steps += 1
        self.num_step_seqs += len(batch.seqs)
        return sampled, step_ms, None

    # -- the step driver (engine/drivers.py) -----------------------------
    @property
    def step_driver(self) -> str:
        """"loop" (steps on the event loop thread), "thread" (a step thread) or "" (not started)."""
        return self._driver.name if self._driver is not None else ""

    def start(self, loop: asyncio.AbstractEventLoop | None = None) -> None:
        """Steps from now on run on a driver (call on the loop's thread: the app's lifespan does)."""
        if self._driver is None:
            self._loop = loop or asyncio.get_running_loop()
            self._driver = choose_driver(self, self._loop)

    def _has_work(self) -> bool:
        sched = self.scheduler
        # sched.has_work, inlined (once per step): held sequences wait for their readers, not for a step
        return bool(self._inbox or self._aborts or self._admin or self._holds or sched.waiting
                    or len(sched.running) > sched.num_held)

    def run_in_step_thread(self, fn: Callable[[], Any], timeout_s: float = 30.0) -> Any:
        """Run fn between two steps (inline when nothing steps, or on the thread that steps)."""
        driver = self._driver
        if driver is None or driver.is_stepper():
            return fn()
        return driver.between_steps(fn, timeout_s)

    async def shutdown(self, grace_s: float = 10.0) -> None:
        """Stop admitting, let in-flight requests finish within grace_s, then stop the thread."""
        self.accepting = False
        deadline = time.perf_counter() + grace_s
        while self._has_work() and time.perf_counter() < deadline:
            await asyncio.sleep(0.02)
        for rid in list(self._seqs):
            self.abort(rid)
        await asyncio.sleep(0.05)
        if self._driver is not None:
            await self._driver.close()
        self._driver = None     # nothing steps any more: admin calls run inline

    # -- sync helper ------------------------------------------------------
    def generate(self, prompts: str | list[int] | list[str] | list[list[int]],
                 params: SamplingParams | None = None) -> Any:
        """Run prompts to completion in the calling thread (scripts, tests, benchmarks).
        One prompt -> GenerateResult; a list of prompts -> list[GenerateResult] (batched)."""
        if self._driver is not None:
            raise InvalidRequest("generate() is for engines that were not start()ed")
        params = params or SamplingParams()
        single = isinstance(prompts, str) or not prompts or isinstance(prompts[0], int)
        items: list[Any] = [prompts] if single else list(prompts)
        seqs = []
        for p in items:
            ids: list[int] = self.tokenizer.encode(p, add_special_tokens=True) if isinstance(p, str) else list(p)
            seq = self._new_seq(ids, params, f"gen-{next(self._ids)}", None)
            self._seqs[seq.request_id] = seq
            self.scheduler.add(seq)
            seqs.append(seq)
        while any(not s.is_finished for s in seqs):
            self.step()
        results = []
        for s in seqs:
            self._seqs.pop(s.request_id, None)
            results.append(GenerateResult(s.request_id, s.prompt_token_ids, s.output_token_ids, s.output_text,
                                          s.finish_reason, s.timings, s.usage, s.error))
        return results[0] if single else results

    def iter_generate(self, prompt_token_ids: list[int], params: SamplingParams) -> Iterator[RequestOutput]:
        """Stream one request's deltas, stepping the engine in the calling thread."""
        if self._driver is not None:
            raise InvalidRequest("iter_generate() is for engines that were not start()ed")
        seq = self._new_seq(prompt_token_ids, params, f"gen-{next(self._ids)}", None)
        self._seqs[seq.request_id] = seq
        self.scheduler.add(seq)
        try:
            while not seq.is_finished:
                for out in self.step():
                    if out.request_id == seq.request_id:
                        yield out
        finally:
            if not seq.is_finished:
                self._finish(seq, "abort")
            self._seqs.pop(seq.request_id, None)
            self.last_request_timings = seq.timings

    def sequence(self, request_id: str) -> Sequence | None:
        return self._seqs.get(request_id)

    # -- introspection ----------------------------------------------------
    def stalled_s(self) -> float:
        """Seconds the engine has had work without scheduling any (0 when idle or progressing)."""
        if not (self.scheduler.has_work or self._inbox):
            return 0.0
        return max(0.0, time.perf_counter() - max(self.last_progress_s, self.last_idle_s))

    def stats(self) -> dict[str, Any]:
        bm = self.block_manager
        gpu = kvpool.gpu_figures(self.device)
        return {
            "stalled_s": self.stalled_s(),
            "stuck_steps": self.num_stuck_steps,
            "stuck_episodes": self.num_stuck_episodes,
            "kv_blocks_total": bm.num_blocks,
            "kv_blocks_used": bm.num_used_blocks,
            "kv_util": bm.usage(),
            "running": len(self.scheduler.running),
            # left out of the batch for a reader far behind: still seated, or parked (seat and blocks given up)
            "held": self.scheduler.num_held + len(self.scheduler.parked),
            "waiting": len(self.scheduler.waiting) + len(self._inbox),
            "prefix_cache_queries": bm.prefix_queries,
            "prefix_cache_hits": bm.prefix_hits,
            "num_preemptions": self.scheduler.num_preemptions,
            "num_steps": self.num_steps,
            "num_step_seqs": self.num_step_seqs,
            "device": self.device,
            **gpu,
            # engine/cuda_runner.py: "on: batch buckets ..." | "off: <why>" (None off CUDA), and its counters
            "cuda_graphs": getattr(self.runner, "graph_status", None),
            "graph_replays": getattr(self.runner, "graph_replays", None),
        }

    def kv_report(self) -> dict[str, Any]:
        return self.run_in_step_thread(lambda: kvpool.kv_report(self))

    def defrag(self, dry_run: bool = False, drop_prefix_cache: bool = False) -> dict[str, Any]:
        """Compact live KV blocks to the low end of the pool between steps (see kvpool.defrag)."""
        return self.run_in_step_thread(lambda: kvpool.defrag(self, dry_run, drop_prefix_cache))

    def live_sequences(self) -> list[Sequence]:
        sched = self.scheduler
        return [s for s in sched.running + list(sched.waiting) + sched.parked if s.status is not FINISHED]

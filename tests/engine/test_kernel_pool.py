"""The kernels' thread pool puts every configured thread to work: over a multi-threaded engine's
steps, each pool thread (the caller and every worker) runs chunks of the jobs. A worker that sleeps
through the jobs (a lost futex wake, a spin that never sees the job, a start-up race) fails this
test; it is a state check on the pool's per-thread counters, never a timing."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
import torch

from zgtool.engine import Engine, EngineConfig, SamplingParams
from zgtool.engine import cpu_kernels as ck

pytestmark = pytest.mark.skipif(not ck.cpu_has_avx2_fma(), reason="the kernels need AVX2 + FMA")

THREADS = 2
MAX_ROUNDS = 40  # rounds of 16 streams x 8 tokens; a working pool needs one


@pytest.fixture
def threads() -> Iterator[int]:
    before = torch.get_num_threads()
    yield THREADS
    torch.set_num_threads(before)


def _run_until_every_thread_worked(run_round: Callable[[], None], threads: int) -> tuple[list[int], list[int], int]:
    ck.library().pool_reset_counters()
    chunks, jobs = [0] * threads, [0] * threads
    for rounds in range(1, MAX_ROUNDS + 1):
        run_round()
        chunks, jobs = ck.pool_counters(threads)
        if all(chunks):
            return chunks, jobs, rounds
    return chunks, jobs, MAX_ROUNDS


def test_every_pool_thread_runs_chunks_of_a_two_thread_engines_steps(threads: int) -> None:
    engine = Engine(EngineConfig(model="dummy:small", dtype="float32", num_threads=threads, max_num_seqs=16,
                                 max_model_len=256))
    assert ck.engine_status(engine) == "on"
    params = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)

    def run_round() -> None:
        engine.generate([[1 + i, 2, 3, 4 + i] for i in range(16)], params)

    chunks, jobs, rounds = _run_until_every_thread_worked(run_round, threads)
    assert ck.library().pool_workers() >= threads - 1
    assert all(chunks), f"chunks per pool thread {chunks} (jobs {jobs}) after {rounds} rounds: a thread never worked"


def test_every_pool_thread_runs_chunks_of_gemm_jobs(threads: int) -> None:
    torch.set_num_threads(threads)
    x, w, ones = torch.randn(16, 512), torch.randn(4096, 512), torch.ones(4096)

    def run_round() -> None:
        for _ in range(20):
            ck.f32_gemm(x, w, ones)

    chunks, jobs, rounds = _run_until_every_thread_worked(run_round, threads)
    assert all(chunks), f"chunks per pool thread {chunks} (jobs {jobs}) after {rounds} rounds: a thread never worked"


def test_the_counters_show_a_thread_that_took_no_work(threads: int) -> None:
    """The check itself: with one thread configured the caller (thread 0) runs every chunk and
    thread 1 none, which is what the tests above would report for a worker that never wakes."""
    torch.set_num_threads(1)
    ck.library().pool_reset_counters()
    ck.f32_gemm(torch.randn(16, 512), torch.randn(4096, 512), torch.ones(4096))
    chunks, jobs = ck.pool_counters(threads)
    assert chunks[0] > 0 and jobs[0] == 1
    assert chunks[1] == 0 and jobs[1] == 0

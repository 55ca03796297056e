"""Over many fresh starts of the kernels' thread pool, every worker computes beside its caller: it
runs jobs, and it runs them on a core of its own (not stacked on the caller's CPU, where it adds
no compute: the single-core starts of issue 26). Each start (pool_stop, then the next job grows a
fresh pool, as a new process does) runs GEMM jobs until the worker has run WORKER_JOBS of them;
the checks are on the pool's per-thread counters (engine/csrc/pool.c), never on a timing.

The pinned case is the inherited-affinity cause: the thread that posts the first job is pinned to
one CPU, and a worker created from it used to inherit that mask, so that every job it ran was on
its caller's core (300 of 300 jobs before the fix). The runs are in a subprocess: pinning a thread
of the test process would leak into the threads created after it."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from zgtool.engine import cpu_kernels as ck

pytestmark = [
    pytest.mark.skipif(not ck.cpu_has_avx2_fma(), reason="the kernels need AVX2 + FMA"),
    pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="a worker beside its caller needs 2 CPUs"),
]

STARTS = 50
WORKER_JOBS = 10        # jobs the worker must run in each start
MAX_JOBS = 3000         # bound per start: a worker that never wakes fails instead of hanging

CHILD = r"""
import json, os, sys, threading
import torch
from zgtool.engine import cpu_kernels as ck

starts, want, max_jobs, pin = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4] == "pin"
torch.set_num_threads(2)
lib = ck.library()
x, w, ones = torch.randn(16, 256), torch.randn(2048, 256), torch.ones(2048)
out = []

def caller():
    if pin:
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})   # this thread only
    for _ in range(starts):
        lib.pool_stop()
        lib.pool_reset_counters()
        jobs = 0
        while jobs < max_jobs:
            ck.f32_gemm(x, w, ones)
            jobs += 1
            if jobs % 5 == 0 and ck.pool_counters_all(2)["jobs"][1] >= want:
                break
        counts = ck.pool_counters_all(2)
        out.append({"posted": jobs, "workers": int(lib.pool_workers()), **{k: v[1] for k, v in counts.items()}})

t = threading.Thread(target=caller)
t.start()
t.join()
print(json.dumps(out))
"""


def _starts(mode: str) -> list[dict[str, int]]:
    proc = subprocess.run([sys.executable, "-c", CHILD, str(STARTS), str(WORKER_JOBS), str(MAX_JOBS), mode],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _check(starts: list[dict[str, int]]) -> None:
    assert len(starts) == STARTS
    idle = [i for i, s in enumerate(starts) if s["jobs"] < WORKER_JOBS]
    assert not idle, f"starts whose worker ran fewer than {WORKER_JOBS} of up to {MAX_JOBS} jobs: " \
                     f"{[(i, starts[i]) for i in idle]}"
    stacked = [i for i, s in enumerate(starts) if 2 * s["shared"] > s["jobs"]]
    assert not stacked, f"starts whose worker ran most of its jobs on its caller's CPU: " \
                        f"{[(i, starts[i]) for i in stacked]}"


def test_every_fresh_pool_start_puts_its_worker_to_work() -> None:
    _check(_starts("free"))


def test_a_pinned_first_caller_does_not_pin_its_workers_to_its_core() -> None:
    _check(_starts("pin"))


def test_pool_stop_ends_the_workers_and_the_next_job_starts_a_fresh_pool() -> None:
    lib = ck.library()
    lib.pool_stop()
    assert lib.pool_workers() == 0
    import torch

    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        ck.f32_gemm(torch.randn(16, 256), torch.randn(2048, 256), torch.ones(2048))
        assert lib.pool_workers() == 1
    finally:
        torch.set_num_threads(before)

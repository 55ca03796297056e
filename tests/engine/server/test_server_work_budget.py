"""The one-token request's work stays where issue 34 left it, counted, never timed: the Python calls
(function entries and coroutine resumptions) that our code and uvicorn's protocol make per request of
``zgtool serve --model null``, driven in process by bench/serving_inproc.py's stand-in connections.

The budget is the count when it was set (126 at c=1, 124 at c=32: bench/serving_breakdown.py has
where they go) plus about 10%. A change that adds per-request work past it must say so here, with
bench/serving_overhead.py's figures before and after. Streams are not counted: how often a stream's
handler wakes depends on the loop driver's time budget per tick, so its count is not a fixed number.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "bench"))
import serving_inproc  # noqa: E402

CALLS_PER_REQUEST_BUDGET = 140
OURS = (str(ROOT / "engine"), str(ROOT / "zgtool"))


def _calls_per_request(concurrency: int, requests: int) -> tuple[float, collections.Counter[str]]:
    import uvloop

    logging.disable(logging.WARNING)
    try:
        built, server = serving_inproc.null_server()
        calls: collections.Counter[str] = collections.Counter()

        def count(frame: Any, event: str, arg: Any) -> None:
            if event == "call":
                code = frame.f_code
                if code.co_filename.startswith(OURS) or "/uvicorn/" in code.co_filename:
                    calls[f"{Path(code.co_filename).name}:{code.co_name}"] += 1

        async def go() -> None:
            make = serving_inproc.start_serving(built, server, asyncio.get_running_loop())
            raw = serving_inproc._request(1, False)
            await serving_inproc.drive(make, raw, False, concurrency, 100)   # warm: memos, prefix cache
            sys.setprofile(count)
            try:
                await serving_inproc.drive(make, raw, False, concurrency, requests)
            finally:
                sys.setprofile(None)
            await built.engine.shutdown(1.0)

        uvloop.run(go())
        built.sock.close()
    finally:
        logging.disable(logging.NOTSET)
    return sum(calls.values()) / requests, calls


# uvicorn's run_asgi entries per request: alone (c=1) the engine's first step runs inline and the
# handler never waits; beside others it waits once for the step and wakes once (wake_on_finish)
@pytest.mark.parametrize(("concurrency", "task_steps"), [(1, 1), (32, 2)])
def test_a_one_token_request_stays_within_its_call_budget(concurrency: int, task_steps: int) -> None:
    per_request, calls = _calls_per_request(concurrency, 640)
    top = ", ".join(f"{name} {n / 640:.1f}" for name, n in calls.most_common(8))
    assert 60 < per_request <= CALLS_PER_REQUEST_BUDGET, f"{per_request:.1f} calls per request; most: {top}"
    assert calls["httptools_impl.py:run_asgi"] / 640 == pytest.approx(task_steps, abs=0.1)

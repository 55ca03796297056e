"""Rules: TOML loading and validation, and `for` semantics over a real exporter server."""

from __future__ import annotations

from pathlib import Path

import pytest
from dcgm_helpers import data

from zgtool.dcgm.metrics import GpuReading
from zgtool.dcgm.rules import Rule, RuleEvaluator, load_rules, parse_duration_s
from zgtool.dcgm.sources import ExporterSource
from zgtool.dcgm.watch import WatchConfig, result_data, watch
from zgtool.errors import UsageError

BUSY = data("exporter_49_h100_2gpu.txt")  # GPU 0 at 91% memory-copy utilisation


class FakeClock:
    """Virtual time for the watch loop: sleeping advances it, nothing really waits."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, s: float) -> None:
        self.now += s


def test_shipped_defaults_include_bandwidth_and_framebuffer_rules():
    rules = {r.name: r for r in load_rules()}
    bw = rules["memory-bandwidth"]
    assert (bw.expr, bw.op, bw.threshold, bw.for_s) == ("mem_copy_util_pct", ">=", 80.0, 30.0)
    assert "bandwidth-bound" in bw.message and "gateway will not help" in bw.message
    assert "fb_used_bytes" in rules["framebuffer-pressure"].metrics


def test_bandwidth_rule_fires_only_after_its_for_duration(exporter):
    exporter.body = BUSY
    clock = FakeClock()
    src = ExporterSource(exporter.url)
    try:
        state = watch(src, load_rules(), WatchConfig(interval_s=5, duration_s=40), clock=clock, sleep=clock.sleep)
    finally:
        src.close()
    assert exporter.hits == 9  # t = 0, 5, ..., 40 s, each a real scrape
    fired = [a for a in state.evaluator.history if a.rule == "memory-bandwidth"]
    assert [a.key for a in fired] == ["h100-node-07/gpu0"]  # the idle GPU 1 never alerts
    assert fired[0].pending_since_s == 0.0
    assert fired[0].fired_at_s == pytest.approx(30.0)
    data_ = result_data(state)
    assert data_["firing"] == ["memory-bandwidth"]
    assert data_["alerts"][0]["fired_at_s"] == pytest.approx(30.0)


def test_bandwidth_rule_stays_pending_when_the_window_is_shorter_than_for(exporter):
    exporter.body = BUSY
    clock = FakeClock()
    src = ExporterSource(exporter.url)
    state = watch(src, load_rules(), WatchConfig(interval_s=5, duration_s=25), clock=clock, sleep=clock.sleep)
    src.close()
    assert state.evaluator.history == []
    pending = [a for a in state.evaluator.active() if a.rule == "memory-bandwidth"]
    assert [a.state for a in pending] == ["pending"]
    assert result_data(state)["alerts"][0]["state"] == "pending"


def test_one_sample_below_threshold_resets_the_for_timer(exporter):
    clock = FakeClock()
    src = ExporterSource(exporter.url)
    bodies = iter([BUSY, BUSY, BUSY, _mem_copy(BUSY, "0.500000"), BUSY, BUSY, BUSY, BUSY])
    exporter.body = next(bodies)

    def tick(_state):
        exporter.body = next(bodies, BUSY)

    rule = Rule("bw", "mem_copy_util_pct", 80, for_s=20)
    state = watch(src, [rule], WatchConfig(interval_s=10, duration_s=70), on_tick=tick,
                  clock=clock, sleep=clock.sleep)
    src.close()
    # busy at 0,10,20 (fires at 20), dips at 30 (resolves), busy again from 40 -> fires at 60
    hist = state.evaluator.history
    assert [(a.fired_at_s, a.resolved_at_s) for a in hist] == [(20.0, 30.0), (60.0, None)]


def _mem_copy(text: str, ratio: str) -> str:
    lines = []
    for ln in text.splitlines():
        if ln.startswith("DCGM_FI_DEV_MEMORY_UTIL_RATIO{gpu=\"0\""):
            ln = ln.rsplit(" ", 1)[0] + " " + ratio
        lines.append(ln)
    return "\n".join(lines) + "\n"


def test_missing_metric_never_fires_and_division_by_zero_is_no_data():
    ev = RuleEvaluator([Rule("fb", "fb_used_bytes / fb_total_bytes * 100", 95, for_s=0)])
    ev.observe(0, [GpuReading("h/gpu0", metrics={"fb_used_bytes": 1.0, "fb_total_bytes": 0.0})])
    ev.observe(1, [GpuReading("h/gpu0", metrics={"gpu_util_pct": 99.0})])
    assert ev.history == []


def test_rule_file_errors_are_usage_errors_naming_the_problem(tmp_path: Path):
    bad_metric = tmp_path / "a.toml"
    bad_metric.write_text('[[rule]]\nname="x"\nexpr="gpu_utilisation"\nthreshold=1\n')
    with pytest.raises(UsageError, match="unknown metric gpu_utilisation"):
        load_rules(bad_metric)
    code = tmp_path / "b.toml"
    code.write_text('[[rule]]\nname="x"\nexpr="__import__(\'os\')"\nthreshold=1\n')
    with pytest.raises(UsageError, match="expr may use"):
        load_rules(code)
    no_threshold = tmp_path / "c.toml"
    no_threshold.write_text('[[rule]]\nname="x"\nexpr="power_w"\n')
    with pytest.raises(UsageError, match="needs threshold"):
        load_rules(no_threshold)
    with pytest.raises(UsageError, match="cannot read rules file"):
        load_rules(tmp_path / "missing.toml")
    with pytest.raises(UsageError, match="op must be one of"):
        Rule("x", "power_w", 1, op="=>")


@pytest.mark.parametrize("text,seconds", [("30s", 30), ("2m", 120), ("500ms", 0.5), (15, 15), ("1.5h", 5400)])
def test_for_durations_accept_prometheus_style_units(text, seconds):
    assert parse_duration_s(text) == pytest.approx(seconds)


def test_bad_for_duration_is_a_usage_error():
    with pytest.raises(UsageError, match="bad duration"):
        parse_duration_s("soon")

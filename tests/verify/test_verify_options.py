"""verify's options, the indicative label, exit status on failed measuring stages and the gate mark."""

from __future__ import annotations

import io
import subprocess
import sys
from pathlib import Path

import pytest
from rich.console import Console

from zgtool.errors import UsageError
from zgtool.verify.plan import Plan, Stage, VerifyConfig, VerifyData
from zgtool.verify.run import Ui, failed_measurements
from zgtool.verify.stages import prompt_of
from zgtool.verify.summary import render_summary

ZG = [sys.executable, "-m", "zgtool"]


def test_requests_max_tokens_and_concurrency_levels_shape_the_plan() -> None:
    plan = Plan.for_config(VerifyConfig(requests=20, max_tokens=32, concurrency=(1, 4, 16)))
    assert [(s.label, s.num_requests) for s in plan.splits] == [
        ("nonstream-c1", 20), ("stream-c1", 20), ("nonstream-c4", 20), ("stream-c4", 20),
        ("nonstream-c16", 20), ("stream-c16", 20)]
    assert plan.split_max_tokens == 32


def test_timeout_s_reaches_every_stage_through_the_plan() -> None:
    assert Plan.for_config(VerifyConfig()).timeout_s is None          # each stage keeps its own default
    assert Plan.for_config(VerifyConfig(timeout_s=7.5)).timeout_s == 7.5


def test_default_plan_keeps_its_sizes_and_quick_is_smaller() -> None:
    full, quick = Plan.for_config(VerifyConfig()), Plan.for_config(VerifyConfig(quick=True))
    assert [s.num_requests for s in full.splits] == [32, 32, 48, 48]
    assert [s.num_requests for s in quick.splits] == [8, 8, 16, 16]


def test_prompt_is_a_preset_name_or_the_text_itself() -> None:
    assert prompt_of("medium")[1] == "medium" and len(prompt_of("medium")[0]) > 100
    assert prompt_of("Why is the sky blue?") == ("Why is the sky blue?", "custom")


@pytest.mark.parametrize("kw", [{"requests": 2}, {"max_tokens": 0}, {"concurrency": ()}, {"concurrency": (0,)},
                                {"prompt": "  "}, {"slo": ("ttft=5",)}, {"slo": ("e2e:-1",)}, {"dtype": "int4"},
                                {"timeout_s": 0}, {"timeout_s": -3}])
def test_bad_options_are_usage_errors(kw: dict) -> None:
    with pytest.raises(UsageError):
        VerifyConfig(**kw)


def test_every_dtype_serve_accepts_verify_accepts_too() -> None:
    from engine.server.config import ServeConfig

    for dtype in ("auto", "float32", "bfloat16", "float16", "int8"):
        assert VerifyConfig(dtype=dtype).dtype == dtype
        ServeConfig(dtype=dtype)


def _data(stages: list[Stage], gate: dict | None = None, verdict: dict | None = None) -> VerifyData:
    return VerifyData(config={}, plan={}, urls={}, stages=stages, files=[], gate=gate, verdict=verdict)


def test_a_failed_measuring_stage_is_found_and_a_skipped_one_is_not() -> None:
    stages = [Stage("start", "start", "ok"), Stage("latency-stream-c1", "latency", "failed", "boom"),
              Stage("k6", "k6", "skipped", "no k6"), Stage("gate", "gate", "breached", "1 check(s) breached")]
    assert [s.name for s in failed_measurements(_data(stages))] == ["latency-stream-c1"]


def _console() -> tuple[Console, io.StringIO]:
    buf = io.StringIO()
    return Console(file=buf, width=100, force_terminal=True, color_system="truecolor"), buf


def test_a_breached_gate_stage_is_marked_with_a_red_cross_not_a_green_tick() -> None:
    console, buf = _console()
    Ui(console).end(Stage("gate", "gate: default policy", "breached", "2 check(s) breached"))
    out = buf.getvalue()
    assert "✗" in out and "✓" not in out


def test_the_summary_shows_a_breached_gate_without_a_tick_and_the_indicative_headline(tmp_path: Path) -> None:
    console, buf = _console()
    gate = {"passed": False, "counts": {"pass": 3, "fail": 1}, "policy": "default_gates.toml",
            "failed": ["p95 total (latency_split-stream-c1.json)"]}
    verdict = {"headline": "Indicative (--quick sample sizes): No significant difference ...", "rows": [],
               "indicative": True, "metrics": []}
    render_summary(_data([], gate, verdict), tmp_path / "report.html", console)
    out = buf.getvalue()
    assert "breached" in out and "✓" not in out and "Indicative" in out


def test_malformed_options_exit_2_before_anything_starts(tmp_path: Path) -> None:
    for args in (["--concurrency", "1,x"], ["--slo", "latency:5"], ["--requests", "1"]):
        proc = subprocess.run([*ZG, "verify", *args, "--out-dir", str(tmp_path / "o")], capture_output=True, text=True,
                              timeout=60)
        assert proc.returncode == 2, (args, proc.stderr)
        assert not (tmp_path / "o").exists()

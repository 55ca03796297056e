"""`latency-split -c 1,4,16 | --rate 1,2,4 | --rate sweep`: run the sweep, print it, write the
latency_sweep result, and map what happened to the exit code."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from zgtool.errors import UsageError
from zgtool.latency.analysis.saturation import qty
from zgtool.latency.config import SplitConfig
from zgtool.latency.schedule.sweep import SweepResult, SweepSpec
from zgtool.targets import Target

KIND = "latency_sweep"


def refuse_with_sweep(**given: object) -> None:
    """Options that read one measurement at a time do not take a sweep (checked before anything is sent)."""
    named = [name for name, value in given.items() if value]
    if named:
        raise UsageError(f"{', '.join(named)} cannot run with a load sweep (a list for -c/--rate, or --rate "
                         "sweep); measure one load point for them")


def _dead(res: SweepResult) -> list[str]:
    return [name for name in res.targets if not any(p.num_ok for p in res.of(name))]


def _unjudged(res: SweepResult) -> list[str]:
    """Paths judged to keep up with a load the client did not send in full: a point at or below the
    knee (or anywhere on a path that never saturated) where it sent under 95% of the offered rate."""
    out = []
    for name in res.targets:
        s = res.saturation.get(name)
        limit = s.saturated_at if s is not None and s.saturated_at is not None else float("inf")
        short = [p.load for p in res.of(name) if p.rate_short and p.load < limit]
        if short:
            out.append(f"{name} at {qty(min(short), res.unit)}")
    return out


def run_sweep_command(targets: Sequence[Target], cfg: SplitConfig, spec: SweepSpec, *, as_json: bool,
                      out: Path | None, quiet: bool, csv_dir: Path | None) -> dict[str, Any]:
    from zgtool.errors import MeasurementUnreliable
    from zgtool.latency.schedule.sweep import result_data, run_sweep
    from zgtool.output import console, emit_result, err_console
    from zgtool.results import make_result

    def progress(msg: str) -> None:
        if not (as_json or quiet):
            err_console.print(f"[dim]{msg}[/dim]", highlight=False)

    res = run_sweep(targets, cfg, spec, progress)
    result = make_result(KIND, result_data(res), target=[t.public() for t in targets])
    from zgtool.latency.render.sweep import render

    emit_result(result, as_json=as_json, out=out,
                render=None if as_json else lambda: render(res, console, stream=cfg.stream, slo=cfg.slo is not None))
    if csv_dir is not None:
        from zgtool.csvout import write_csv

        for path in write_csv(result, csv_dir):
            err_console.print(f"[dim]wrote {path}[/dim]", highlight=False)
    dead = _dead(res)
    if dead:
        raise MeasurementUnreliable(f"every request failed at every load on {', '.join(dead)}: nothing was measured")
    cut = _unjudged(res)
    if cut:
        raise MeasurementUnreliable("latency-split sweep: the load generator fell behind its schedule before "
                                    f"the path saturated ({'; '.join(cut)}), so the knee there is not measured")
    return result

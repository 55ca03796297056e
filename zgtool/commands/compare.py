"""`zgtool compare`: latency-split (or k6 bench) runs side by side, with between-run intervals and regressions."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

import typer

from zgtool.commands import vocabulary as v

HELP = """Compare latency-split results across runs (nightly runs, before/after a change), or k6 bench results.

Each path's medians per run with the between-run 95% t-interval (over the runs' medians), the tax of every hop per run (its own paired interval) and across runs, and each run against the baseline (the first file, or --baseline). Runs must measure the same workload and the same number of paths (matched by position); otherwise one line names the difference, exit 2. Bench results: each scenario's median duration with its interval, direct first; a hop's tax is its scenario's median minus direct's, paired by the scenarios' turns (bench --rounds); a change counts from max(1 ms, 10%).
"""
EXAMPLES = """
Examples:

  zgtool compare mon.json tue.json wed.json
  zgtool compare runs/*.json --baseline runs/main.json --fail-on-regression
  zgtool compare a.json b.json --plots plots/ --summary-md comment.md
"""


@dataclass(frozen=True)
class CompareOptions:
    files: tuple[Path, ...]
    baseline: Path | None
    plots_dir: Path | None
    summary_md: Path | None
    as_json: bool
    out: Path | None
    fail_on_regression: bool
    every: bool = False


def run(opts: CompareOptions) -> dict:
    import shutil

    from zgtool.compare import render, stats
    from zgtool.compare.runs import BENCH_KIND, load_runs
    from zgtool.errors import VerdictFailed
    from zgtool.output import emit_result, err_console
    from zgtool.results import make_result

    runs = load_runs(list(opts.files), opts.baseline)
    labels = [r.label for r in runs]
    metrics, taxes, changed = stats.metric_rows(runs), stats.tax_rows(runs), stats.changes(runs)
    regressions = sum(1 for c in changed if c.verdict == "regression" and c.counted)
    open_taxes = sum(1 for c in changed if c.verdict == "inconclusive" and c.counted and c.metric.endswith(" tax"))
    sentence = render.verdict(labels, metrics, taxes, regressions, open_taxes)
    width = shutil.get_terminal_size((100, 24)).columns
    effect = "max(1 ms, 10%)" if runs[0].kind == BENCH_KIND else "max(0.2 ms, 2%)"    # stats.smallest_effect
    if not opts.as_json:
        lines = [sentence, "", "Each path per run (medians, ms; req/s and tok/s for throughput):"]
        lines += render.metric_table(labels, metrics, width)
        if taxes:
            how = (f"within each run: {runs[0].pairing}; total_ms is k6's http_req_duration"
                   if runs[0].kind == BENCH_KIND else "paired within each run")
            lines += ["", f"Tax per hop (candidate minus path 1, {how}):"]
            lines += render.tax_table(labels, taxes, width)
        lines += ["", f"Against the baseline {labels[0]} (* or n.s.: whether the interval excludes 0):"]
        lines += render.change_table(changed, width, every=opts.every, effect=effect)
        typer.echo("\n".join(lines))
    if opts.summary_md is not None:
        opts.summary_md.write_text(render.summary_markdown(sentence, labels, taxes, changed, effect))
        err_console.print(f"[dim]summary written to {opts.summary_md}[/dim]", highlight=False)
    if opts.plots_dir is not None:
        from zgtool.compare.plots import write_plots

        for p in write_plots(runs, taxes, opts.plots_dir):
            err_console.print(f"[dim]wrote {p}[/dim]", highlight=False)
    data = {"verdict": sentence, "runs": [{"label": r.label, "file": str(r.path), "created": r.created,
                                          "paths": list(r.path_names)} for r in runs],
            "metrics": [asdict(m) for m in metrics], "tax": [asdict(t) for t in taxes],
            "changes": [asdict(c) for c in changed], "regressions": regressions,
            "definitions": {"across": "t-interval over the runs' medians, mean +/- t(0.975, k-1) sd/sqrt(k)",
                            "changes": "this run's median minus the baseline's, interval from both medians' "
                                       "bootstrap intervals (normal approximation); a change counts above "
                                       f"{effect} of the baseline",
                            "verdicts": "regression or improvement: the interval excludes 0 and the change counts; "
                                        f"no change: the interval lies within +/-{effect}; inconclusive: neither, "
                                        "the interval still reaches a change that counts; no interval: one figure "
                                        "per run"}}
    result = make_result("compare", data)
    emit_result(result, as_json=opts.as_json, out=opts.out)
    if opts.fail_on_regression and regressions:
        raise VerdictFailed(f"{regressions} regression(s) against {labels[0]}")
    return result


def register(app: typer.Typer) -> None:
    @app.command("compare", help=HELP, epilog=EXAMPLES)
    def compare(
        files: list[Path] = typer.Argument(..., help="latency-split or bench result files (-o of each run)."),
        baseline: Path | None = typer.Option(None, "--baseline", help="The run the others are compared with "
                                             "(default: the first file)."),
        plots_dir: Path | None = typer.Option(None, "--plots", metavar="DIR",
                                              help="Write PNG and SVG figures into DIR (the plots extra)."),
        summary_md: Path | None = typer.Option(None, "--summary-md", metavar="FILE",
                                               help="Write a Markdown summary for a CI comment."),
        as_json: bool = v.as_json(), out: Path | None = v.output(),
        fail_on_regression: bool = typer.Option(False, "--fail-on-regression",
                                                help="Exit 1 when a run regressed against the baseline."),
        every: bool = typer.Option(False, "--every", help="List every comparison with the baseline, not only "
                                   "the regressions and improvements."),
    ) -> None:
        run(CompareOptions(tuple(files), baseline, plots_dir, summary_md, as_json, out, fail_on_regression, every))

"""`zgtool gate`: CI performance gates over result files (exit 0 pass, 1 breach, 2 bad policy)."""

from __future__ import annotations

from pathlib import Path

import typer


def register(app: typer.Typer) -> None:
    @app.command("gate")
    def gate(
        results: list[Path] = typer.Argument(..., metavar="RESULT...", help="zgtool result files (JSON) to check."),
        policy: Path | None = typer.Option(
            None, "--policy", "-p", help="Policy TOML (default: the shipped default_gates.toml)."
        ),
        baseline: Path | None = typer.Option(None, "--baseline", help="A stored result to compare against."),
        max_regression: str | None = typer.Option(
            None, "--max-regression", help="Allowed increase over --baseline, e.g. 10% (default: the policy's)."
        ),
        as_json: bool = typer.Option(False, "--json", help="Print the gate result as JSON."),
        out: Path | None = typer.Option(None, "-o", "--output", help="Write the gate result to FILE."),
    ) -> None:
        """Check result files against a policy; exit 1 when a rule is breached."""
        run_gate(results, policy, baseline, max_regression, as_json, out)


def run_gate(
    result_paths: list[Path],
    policy_path: Path | None,
    baseline_path: Path | None,
    max_regression: str | None,
    as_json: bool,
    out: Path | None,
) -> None:
    import math

    from zgtool.errors import UsageError, VerdictFailed
    from zgtool.gate import LoadedResult, evaluate, load_policy, parse_percent
    from zgtool.gate.render import render_report
    from zgtool.output import console, emit_result, err_console
    from zgtool.results import load_result, make_result

    policy = load_policy(policy_path)
    if max_regression is not None and baseline_path is None:
        raise UsageError("--max-regression needs --baseline FILE")
    ratio = parse_percent(max_regression, what="--max-regression") if max_regression is not None else None
    loaded = [LoadedResult(str(p), load_result(p)) for p in result_paths]
    base = LoadedResult(str(baseline_path), load_result(baseline_path)) if baseline_path else None
    report = evaluate(policy, loaded, baseline=base, max_regression=ratio)
    render_report(report, err_console if as_json else console)
    result = make_result("gate", report)
    for row in result["data"]["rows"]:
        # a ratio over a measured 0 is +-inf: JSON has no such number, so write null
        row["values"] = [v if math.isfinite(v) else None for v in row["values"]]
    emit_result(result, as_json=as_json, out=out)
    if not report.passed:
        failed = report.counts.get("fail", 0)
        raise VerdictFailed(f"gate failed: {failed} of {len(report.rows)} checks breached ({report.policy})")

"""`zgtool gate`: CI performance gates over result files (exit 0 pass, 1 breach, 2 bad policy or input,
5 the measurement is unreliable)."""

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
        summary_md: Path | None = typer.Option(
            None, "--summary-md", help="Also write a Markdown summary, e.g. to \"$GITHUB_STEP_SUMMARY\" (appended)."
        ),
        junit: Path | None = typer.Option(None, "--junit", help="Also write JUnit XML (one testcase per check)."),
        allow_empty: bool = typer.Option(
            False, "--allow-empty", help="Exit 0 when no rule of the policy applied to the results (default: exit 2)."
        ),
    ) -> None:
        """Check result files against a policy.

        The default policy reads any result: a two-target latency-split by position (the first target is
        the baseline, the second the candidate, paired per round), a one-target run, verify's files, a
        sweep, a k6 bench. Each PASS or FAIL line says why in words.

        Exit 0 pass, 1 a gate breached, 2 a bad policy or input (unknown field, a baseline of another
        kind or other targets), or no rule applied to the results (unless --allow-empty), 5 the
        measurement is unreliable (a rule with category = "measurement" failed, e.g. the load generator
        dropped iterations, or every request of a run failed).

        Examples:
          zgtool latency-split http://base:8000 http://cand:8000 -n 200 -o pair.json
          zgtool gate pair.json --summary-md "$GITHUB_STEP_SUMMARY" --junit gate.xml
          zgtool gate --policy gates.toml reports/bench.json --baseline main.json --max-regression 15%
        """
        run_gate(results, policy, baseline, max_regression, as_json, out, summary_md, junit, allow_empty)


def run_gate(
    result_paths: list[Path],
    policy_path: Path | None,
    baseline_path: Path | None,
    max_regression: str | None,
    as_json: bool,
    out: Path | None,
    summary_md: Path | None = None,
    junit: Path | None = None,
    allow_empty: bool = False,
) -> None:
    import math

    from zgtool.errors import MeasurementUnreliable, UsageError, VerdictFailed
    from zgtool.gate import LoadedResult, evaluate, load_policy, parse_percent
    from zgtool.gate.evaluate import check_applied, unreliable_message
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
    result = make_result("gate", report)
    result["data"]["verdict"] = report.verdict  # pass | fail | unreliable
    # passes whose interval reaches past the allowance ([paired] inconclusive = "unreliable" fails them instead)
    result["data"]["inconclusive"] = sum(1 for r in report.inconclusive_rows if r.status == "pass")
    for row in result["data"]["rows"]:
        # a ratio over a measured 0 is +-inf: JSON has no such number, so write null
        row["values"] = [v if math.isfinite(v) else None for v in row["values"]]
    emit_result(result, as_json=as_json, out=out, render=lambda: render_report(report, err_console if as_json else console))
    _write_ci_outputs(report, summary_md, junit)
    if report.verdict == "unreliable":
        names = unreliable_message(report)
        also = f" ({len(report.breaches)} gate checks also breached)" if report.breaches else ""
        raise MeasurementUnreliable(f"gate: the measurement is unreliable, not judged: {names}{also}")
    check_applied(report, loaded, allow_empty=allow_empty)
    if not report.passed:
        failed = report.counts.get("fail", 0)
        raise VerdictFailed(f"gate failed: {failed} of {len(report.rows)} checks breached ({report.policy})")


def _write_ci_outputs(report: object, summary_md: Path | None, junit: Path | None) -> None:
    from zgtool.errors import UsageError
    from zgtool.gate.ci_outputs import junit_xml, markdown_summary
    from zgtool.gate.records import GateReport

    assert isinstance(report, GateReport)
    try:
        if summary_md is not None:
            with summary_md.open("a") as f:  # $GITHUB_STEP_SUMMARY collects every step's text
                f.write(markdown_summary(report))
        if junit is not None:
            junit.write_text(junit_xml(report))
    except OSError as exc:
        raise UsageError(f"cannot write the gate summary: {exc}") from exc

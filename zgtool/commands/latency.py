"""`zgtool latency-split TARGET [TARGET ...]`: where every millisecond goes, side by side across paths."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from zgtool.commands import latency_options as o
from zgtool.commands.latency_options import SplitOptions

if TYPE_CHECKING:
    from zgtool.latency.records import RequestSample, SplitResult, TargetResult
    from zgtool.targets import Target

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


def _resolve_targets(opts: SplitOptions, progress_note: dict[str, dict[str, str]]) -> list[Target]:
    """Each TARGET as a Target (zgtool.toml names resolved; a bare URL's API/model detected unless given);
    the same target twice (an A/A run) gets distinct names. Detected API/models go into progress_note."""
    from dataclasses import replace

    from zgtool.latency.wire.same_model import Detect, detect_targets
    from zgtool.targets import resolve

    resolved = []
    seen: dict[str, int] = {}
    how = Detect(api_known=opts.api is not None, model_known=opts.model is not None,
                 timeout_s=opts.detect_timeout_s, verify=opts.split.verify)
    asked = [(resolve(spec, opts.config_file, api=opts.api, model=opts.model, headers=opts.headers), "://" in spec)
             for spec in opts.targets]
    for t, found in detect_targets(asked, how):
        if found is not None:
            progress_note[t.name] = found.public()
        seen[t.name] = seen.get(t.name, 0) + 1
        if seen[t.name] > 1:
            t = replace(t, name=f"{t.name}#{seen[t.name]}")
        resolved.append(t)
    return resolved


def _all_failed(t: TargetResult) -> str:
    """'NAME: all N requests failed (http_404 x2): <the server's own words>'."""
    from zgtool.targets import KEY_HINT

    line = f"{t.name}: all {t.num_error} requests failed ({', '.join(f'{k} x{v}' for k, v in t.errors.items())})"
    said = next((s.error_detail for s in t.samples if s.error_detail), None)
    hint = f"; {KEY_HINT}" if any(k.startswith("http_401") for k in t.errors) else ""
    return line + (f": the server said {said!r}" if said else "") + hint


class _Progress:
    """The live progress line, and the one line per detected API/model once the targets answered."""

    def __init__(self, opts: SplitOptions, targets: int, detected: dict[str, dict[str, str]]) -> None:
        from zgtool.progress import ProgressLine

        self.as_json = opts.as_json
        self.bar = ProgressLine("latency-split", opts.split.num_requests * targets, quiet=opts.quiet)
        self.untold = dict(detected)
        self.block_done: dict[str, int] = {}

    def __call__(self, name: str, done: int, total: int) -> None:
        from zgtool.output import err_console

        self.block_done[name] = done
        if not self.as_json and self.untold:   # once the targets answered (an unreachable one stops the run)
            self.bar.clear()
        while self.untold and not self.as_json:
            tname, found = self.untold.popitem()
            engine = f"; engine {found['engine']} ({found['engine_evidence']})" if "engine" in found else ""
            err_console.print(f"{tname}: detected the {found['api']} API, model {found['model']!r} "
                              f"({found['how']}){engine}; --api/--model override", highlight=False)
        self.bar.advance_to(sum(self.block_done.values()))


def _start_receiver(opts: SplitOptions) -> Any:
    """--otlp-listen: the OTLP span receiver (OTLP/HTTP and OTLP/gRPC), started (None without the option)."""
    if opts.otlp_listen_at is None:
        return None
    from zgtool.errors import UsageError
    from zgtool.latency.attribution.otlp import OtlpReceiver
    from zgtool.output import err_console

    try:
        receiver = OtlpReceiver(*opts.otlp_listen_at).start()
    except OSError as exc:
        raise UsageError(f"--otlp-listen {opts.otlp_listen}: {exc}") from None
    err_console.print(f"OTLP receiver on {receiver.url}, OTLP/HTTP and OTLP/gRPC "
                      f"(vLLM: vllm serve ... --otlp-traces-endpoint {receiver.url})", highlight=False)
    return receiver


def _engine_metrics_fallback(opts: SplitOptions, resolved: list[Target]) -> tuple[str, Any] | None:
    """The first (direct) target's /metrics and whose it is, when it exposes vLLM's request histograms or
    llama-server's counters (--metrics): the default source of the engine's phases for a path whose answers lack
    them (a gateway that strips vLLM's per-request metrics or llama.cpp's timings). Deltas around a request
    belong to it only at -c 1, closed loop; one bounded scrape decides."""
    cfg = opts.split
    if cfg.concurrency != 1 or cfg.open_loop or len(resolved) < 2 or resolved[0].scheme != "http":
        return None
    from zgtool.latency.attribution.promdelta import kind_of
    from zgtool.latency.attribution.scrape import Limits, Scraper
    from zgtool.workload.prefix_cache import metrics_url

    url = metrics_url(resolved[0].url)
    s = Scraper(url, Limits(timeout_s=1.0)).scrape()
    kind = kind_of(s) if s.ok else None
    return (url, kind) if kind is not None else None


def _given_metrics_kind(url: str) -> Any:
    """--vllm-metrics URL: vLLM's histograms, or llama-server's counters where the page holds those instead."""
    from zgtool.latency.attribution.promdelta import VLLM, kind_of
    from zgtool.latency.attribution.scrape import Limits, Scraper

    s = Scraper(url, Limits(timeout_s=1.0)).scrape()
    return (kind_of(s) if s.ok else None) or VLLM


def _hooks(opts: SplitOptions, resolved: list[Target], bar: Any) -> tuple[list | None, Any]:
    """RequestHooks around each measured request (vLLM's histogram deltas, the prefix-cache watch, the
    open-loop progress count) and the prefix-cache watch itself (None when not asked for)."""
    cfg = opts.split
    hooks: list | None = None
    if opts.vllm_metrics:
        from zgtool.latency.attribution.promdelta import DeltaWatch

        watch = DeltaWatch(opts.vllm_metrics, cfg.concurrency)    # -c other than 1 refused before a scrape
        watch.kind = _given_metrics_kind(opts.vllm_metrics)
        hooks = [watch for _ in resolved]
    elif (found := _engine_metrics_fallback(opts, resolved)) is not None:
        from zgtool.latency.attribution.promdelta import DeltaWatch

        hooks = [DeltaWatch(found[0], cfg.concurrency, found[1])] * len(resolved)
    pwatch = None
    if opts.workload is not None or opts.metrics_url:    # the engine's prefix-cache hit rate over the run
        from zgtool.workload.split import prefix_watch

        pwatch = prefix_watch([t.url for t in resolved] if opts.workload else [],
                              [u for u in (opts.metrics_url, opts.vllm_metrics) if u], cfg.verify)
        if pwatch is not None:
            from zgtool.latency.schedule.runner import _split

            hooks = pwatch.hooks(hooks, [t.name for t in resolved],
                                 _split(cfg.num_requests, cfg.effective_rounds), cfg.open_loop)
    if cfg.open_loop:   # its dispatcher calls hooks, not on_sample: count there
        from zgtool.progress import CountingHook

        hooks = [CountingHook(bar, h) for h in (hooks or [None] * len(resolved))]
    return hooks, pwatch


def _scrape_loop(opts: SplitOptions, resolved: list[Target], t0_ns: int) -> Any:
    """--scrape: the /metrics time series (zgtool.latency.schedule.scrapeloop), started; None without it."""
    if not opts.scrape:
        return None
    from zgtool.latency.schedule.scrapeloop import ScrapeLoop
    from zgtool.latency.wire.client import ssl_context
    from zgtool.workload.prefix_cache import metrics_url

    urls = [u for src in opts.scrape for u in ([metrics_url(t.url) for t in resolved] if src == "auto" else [src])]
    ctx = ssl_context(opts.split.verify) if any(u.startswith("https:") for u in urls) else None
    return ScrapeLoop(urls, interval_s=opts.scrape_interval_s, t0_ns=t0_ns, ctx=ctx).start()


def _measure(opts: SplitOptions, resolved: list[Target], progress: _Progress, cpu: Any,
             open_loop: Any, scraped: list[Any]) -> tuple[list[list[RequestSample]], Any]:
    """Every target measured (zgtool.latency.schedule.runner), spans joined when --otlp-listen; returns the
    samples per target and the prefix-cache watch; --scrape's loop, stopped, is appended to `scraped`."""
    from time import perf_counter_ns

    from zgtool.latency.schedule.runner import measure_targets

    receiver = _start_receiver(opts)
    t0_ns = perf_counter_ns()
    loop = _scrape_loop(opts, resolved, t0_ns)
    try:
        hooks, pwatch = _hooks(opts, resolved, progress.bar)
        samples = measure_targets(resolved, opts.split, progress=progress, cpu=cpu, hooks=hooks,
                                  open_loop=open_loop, on_sample=lambda s: progress.bar.add(s.ok), t_run0_ns=t0_ns)
        if pwatch is not None:
            pwatch.finish()
        if receiver is not None:
            from zgtool.latency.attribution.otlp import (
                attach_hop_spans,
                attach_spans,
                mark_trace_context,
                settle_spans,
            )

            for per_target in samples:
                attach_spans(per_target, receiver.store)
            settle_spans(samples, receiver.store)
            attach_hop_spans(samples, receiver.store)
            for per_target in samples:      # after the wait: the spans that came, came
                mark_trace_context(per_target, receiver.store)
    finally:
        progress.bar.close()
        if receiver is not None:
            receiver.close()
        if loop is not None:
            loop.stop()
            scraped.append(loop)
    return samples, pwatch


def _analyse(opts: SplitOptions, resolved: list[Target], samples: list[list[RequestSample]], cpu: Any,
             open_loop: Any, detected: dict[str, dict[str, str]]) -> SplitResult:
    from zgtool.latency.analysis.missing_engine import no_engine_time_note
    from zgtool.latency.analysis.phases import analyse
    from zgtool.latency.attribution.adapters import count_warnings

    res = analyse(resolved, samples, opts.split, cpu=cpu.per_request_ms() if cpu else None)
    for tr, per_target in zip(res.targets, samples, strict=True):
        tr.attribution_warnings = count_warnings(per_target)
        tr.detected = detected.get(tr.name)
    if (note := no_engine_time_note(res.targets, opts.split.concurrency, opts.split.open_loop)) is not None:
        res.attribution_notes.append(note)
    if len(resolved) == 1 and any(s.ok for s in samples[0]):    # a gateway alone: the command for its tax
        from zgtool.latency.tokencount import TOKENIZE_TIMEOUT_S
        from zgtool.workload.upstream import tax_hint

        one = resolved[0]
        hint = tax_hint(one.url, one.model, one.auth_headers(), verify=opts.split.verify,
                        timeout_s=min(opts.split.timeout_s, TOKENIZE_TIMEOUT_S))
        if hint is not None:
            res.attribution_notes.append(hint)
    if open_loop is not None:
        from zgtool.latency.analysis.openloop import summarize_open_loop

        for tr, per_target in zip(res.targets, samples, strict=True):
            tr.open_loop = summarize_open_loop(per_target, opts.split, open_loop.records.get(tr.name))
    return res


def _render(res: SplitResult, data: dict, pwatch: Any, brief: bool = False) -> None:
    """The terminal report: the verdict sentence first, then waterfall and table, the field's figures, where
    the engine phases came from (--brief: the sentence and the side-by-side table only)."""
    from zgtool.latency.render.fieldlines import field_lines
    from zgtool.latency.render.headline import headline
    from zgtool.latency.render.split import legend, render, short_names, side_by_side
    from zgtool.output import console

    console.print(headline(res), highlight=False, soft_wrap=not console.is_terminal)
    if data.get("server_metrics"):
        from zgtool.latency.render.servermetrics import verdict_lines

        for line in verdict_lines(data["server_metrics"], res):
            console.print(line, highlight=False, soft_wrap=not console.is_terminal)
    if data.get("from_log"):
        from zgtool.latency.attribution.fromlog import lines as log_lines

        for line in log_lines(data["from_log"]):
            console.print(line, highlight=False, soft_wrap=not console.is_terminal)
    if data.get("cost"):
        from zgtool.latency.analysis.cost import cost_lines

        for line in cost_lines(data["cost"]):
            console.print(line, highlight=False, soft_wrap=not console.is_terminal)
    if brief:
        if len(res.targets) > 1:
            short = short_names([tr.name for tr in res.targets])
            console.print(side_by_side(res, short, width=console.width))
            if (lg := legend([tr.name for tr in res.targets], short)) is not None:
                console.print(lg)
        return
    render(res, console)
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
    if any(tr.open_loop is not None for tr in res.targets):
        from zgtool.latency.render.openloop import print_open_loop

        print_open_loop(res, console)


def _verdict(res: SplitResult) -> None:
    """Exit 5 when a target answered nothing (nothing was measured) or the load generator fell behind its
    schedule: either way the run cannot judge the system."""
    from zgtool.errors import MeasurementUnreliable

    dead = [t for t in res.targets if t.num_ok == 0]
    if dead:
        raise MeasurementUnreliable("; ".join(_all_failed(t) for t in dead))
    behind = [t for t in res.targets if t.open_loop is not None and t.open_loop.load_generator_behind]
    if behind:
        raise MeasurementUnreliable("latency-split: the load generator fell behind its schedule, so the run does "
                                    "not show the asked load: " + "; ".join(
                                        f"{t.name}: {t.open_loop.reason}" for t in behind if t.open_loop))


def run(opts: SplitOptions) -> dict:
    """The command's logic, callable without Typer (build opts with parse_split_options); returns the
    versioned result."""
    from zgtool.latency.result import result_data
    from zgtool.latency.schedule.cputime import CpuWatch
    from zgtool.latency.schedule.openloop import OpenLoopLog
    from zgtool.output import emit_result, err_console
    from zgtool.results import make_result

    if opts.workload is not None and not (opts.as_json or opts.quiet):
        err_console.print(f"[dim]{opts.workload.summary()}[/dim]", highlight=False)
    exporter = None
    if opts.otlp_endpoint:
        from zgtool.otel_metrics import GenAiMetrics

        exporter = GenAiMetrics.for_endpoint(opts.otlp_endpoint, verify=opts.split.verify)
    detected: dict[str, dict[str, str]] = {}
    resolved = _resolve_targets(opts, detected)
    from zgtool.latency.tokencount import count_tokens, token_counts

    opts, counting = count_tokens(opts, resolved)    # --tokenizer: synthetic prompts to their exact lengths
    if opts.sweep is not None:
        from zgtool.commands.latency_sweep import run_sweep_command

        return run_sweep_command(resolved, opts.split, opts.sweep, as_json=opts.as_json, out=opts.out,
                                 quiet=opts.quiet, csv_dir=opts.csv_dir)
    open_loop = OpenLoopLog() if opts.split.open_loop else None
    cpu = CpuWatch(dict(opts.cpu_groups)) if opts.cpu_groups else None
    scraped: list[Any] = []      # --scrape's loop, once stopped
    from zgtool.latency.schedule.runner import MeasureInterrupted

    try:
        samples, pwatch = _measure(opts, resolved, _Progress(opts, len(resolved), detected), cpu, open_loop,
                                   scraped)
        interrupted = False
    except MeasureInterrupted as exc:   # Ctrl-C: keep what finished, say so, exit 130 (zgtool.app)
        if not any(exc.samples):
            raise
        from zgtool.errors import mark_interrupted

        mark_interrupted()
        samples, pwatch, interrupted = exc.samples, None, True
    if exporter is not None:
        exporter.export_split(resolved, samples, stream=opts.split.stream, err=err_console)
    res = _analyse(opts, resolved, samples, cpu, open_loop, detected)
    data = result_data(res)
    data["token_counts"], token_warnings = token_counts(counting, res, opts.split.num_requests)
    for line in token_warnings:
        err_console.print(f"[yellow]warning:[/yellow] {line}", highlight=False)
    if pwatch is not None:
        data["prefix_cache"] = pwatch.result()
    if opts.core_hour_price is not None or opts.gpu_hour_price is not None:
        from zgtool.latency.analysis.cost import cost

        data["cost"] = cost(res, opts.core_hour_price, opts.gpu_hour_price)
    if opts.from_log:
        from zgtool.latency.attribution.fromlog import compare

        data["from_log"] = compare(opts.from_log, res)
    if scraped:
        from zgtool.latency.schedule.scrapeloop import warnings as scrape_warnings

        data["server_metrics"] = scraped[0].result()
        for line in scrape_warnings(data["server_metrics"]):
            err_console.print(f"[yellow]warning:[/yellow] {line}", highlight=False)
    if interrupted:
        data["interrupted"] = True
    result = make_result("latency_split", data, target=[t.public() for t in resolved])
    if interrupted:
        done = sum(len(per) for per in samples)
        err_console.print(f"Ctrl-C after {done} of {opts.split.num_requests * len(resolved)} requests: the summary "
                          "and the written result cover the requests that finished (marked so in the result)",
                          highlight=False)
    emit_result(result, as_json=opts.as_json, out=opts.out,
                render=None if opts.as_json else lambda: _render(res, data, pwatch, opts.brief))
    if opts.csv_dir is not None:
        from zgtool.csvout import write_csv

        for path in write_csv(result, opts.csv_dir):
            err_console.print(f"[dim]wrote {path}[/dim]", highlight=False)
    if not interrupted:
        _verdict(res)
    return result


def register(app: typer.Typer) -> None:
    from zgtool.workload.spec import epilog

    @app.command("latency-split", help=HELP, epilog=epilog())
    def latency_split(
        targets: list[str] = o.TARGETS, requests: int | None = o.REQUESTS, concurrency: str = o.CONCURRENCY,
        warmup: int = o.WARMUP, stream: bool = o.STREAM, prompt: str = o.PROMPT, prompt_file: Path | None = o.PROMPT_FILE,
        max_tokens: str = o.MAX_TOKENS, new_connection: bool = o.NEW_CONNECTION, api: str | None = o.API,
        model: str | None = o.MODEL, timeout_s: float = o.TIMEOUT_S, timeout_old: float | None = o.TIMEOUT_OLD,
        insecure: bool = o.INSECURE, cacert: Path | None = o.CACERT, rounds: int = o.ROUNDS,
        slo: list[str] = o.SLO, cpu_pid: list[str] = o.CPU_PID, config: Path | None = o.CONFIG,
        as_json: bool = o.JSON, out: Path | None = o.OUTPUT, csv_dir: Path | None = o.CSV, quiet: bool = o.QUIET,
        otlp_endpoint: str | None = o.OTLP_ENDPOINT, otlp_listen: str | None = o.OTLP_LISTEN,
        vllm_metrics: str | None = o.VLLM_METRICS, rate: str | None = o.RATE, arrivals: str = o.ARRIVALS,
        max_in_flight: int = o.MAX_IN_FLIGHT, point_s: float = o.POINT_S, dataset: str | None = o.DATASET,
        speedup: float = o.SPEEDUP, metrics_url: str | None = o.METRICS_URL, brief: bool = o.BRIEF,
        tokenizer: str = o.TOKENIZER, scrape: list[str] = o.SCRAPE, scrape_interval_s: float = o.SCRAPE_INTERVAL_S,
        core_hour_price: float | None = o.CORE_HOUR_PRICE, gpu_hour_price: float | None = o.GPU_HOUR_PRICE,
        runs: int = o.RUNS, from_log: str | None = o.FROM_LOG, header: list[str] = o.HEADER,
        accept_encoding: str = o.ACCEPT_ENCODING,
    ) -> None:
        opts = o.parse_split_options(**locals())
        if opts.runs > 1:
            from zgtool.commands.latency_runs import run_repeated

            run_repeated(opts, opts.runs, run)
            return
        run(opts)

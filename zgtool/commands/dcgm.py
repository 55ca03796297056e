"""`zgtool dcgm watch` (GPU golden metrics + rules) and `zgtool defrag` (engine KV pool).

Wiring only: measurement lives in zgtool.dcgm.*, imported inside the commands so
`zgtool --help` never pays for httpx, prometheus_client or pynvml.
"""

from __future__ import annotations

import os
from pathlib import Path

import typer

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


def register(app: typer.Typer) -> None:
    dcgm_app = typer.Typer(help="GPU golden metrics from dcgm-exporter, Prometheus, NVML or the engine.",
                           no_args_is_help=True)

    @dcgm_app.command("watch", help=WATCH_HELP)
    def watch_cmd(
        endpoint: str = typer.Option(None, "--endpoint", help="dcgm-exporter URL (…:9400/metrics)."),
        prometheus: str = typer.Option(None, "--prometheus", help="Prometheus server URL (HTTP query API)."),
        selector: str = typer.Option("", "--selector",
                                     help='Extra PromQL label matchers for --prometheus, e.g. Hostname=~"gpu-.*".'),
        engine: str = typer.Option(None, "--engine", help="zgtool engine URL (reads its /metrics)."),
        nvml: bool = typer.Option(False, "--nvml", help="Local GPUs through NVML (nvidia-ml-py)."),
        interval: float = typer.Option(1.0, "--interval", help="Seconds between samples."),
        duration: float = typer.Option(None, "--duration", help="Stop after this many seconds."),
        once: bool = typer.Option(False, "--once", help="Take one sample, print it and exit."),
        as_json: bool = typer.Option(False, "--json", help="Print the dcgm.watch result as JSON (no live table)."),
        record: Path = typer.Option(None, "--record", "-o", help="Write the dcgm.watch timeline result here."),
        rules_file: Path = typer.Option(None, "--rules", help="Rules TOML (default: the shipped rules)."),
        no_rules: bool = typer.Option(False, "--no-rules", help="Evaluate no rules."),
        fail_on_alert: bool = typer.Option(False, "--fail-on-alert", help="Exit 1 if any rule fired."),
        insecure: bool = typer.Option(False, "--insecure", "-k", help="Do not verify TLS certificates."),
        cacert: Path = typer.Option(None, "--cacert", help="CA bundle for a self-signed https source."),
    ) -> None:
        from zgtool.dcgm.rules import load_rules
        from zgtool.dcgm.sources import open_source
        from zgtool.dcgm.watch import WatchConfig, result_data, watch
        from zgtool.errors import UsageError, VerdictFailed
        from zgtool.output import console, emit_result
        from zgtool.results import make_result

        if no_rules and rules_file is not None:
            raise UsageError("--rules and --no-rules exclude each other")
        config = WatchConfig(interval_s=interval, duration_s=duration, once=once)
        rules = [] if no_rules else load_rules(rules_file)
        from zgtool.tlsverify import verify_setting

        source = open_source(endpoint=endpoint, prometheus=prometheus, engine=engine, nvml=nvml,
                             selector=selector, verify=verify_setting(insecure, cacert))
        try:
            if as_json or once:
                state = watch(source, rules, config)
            else:
                state = _watch_live(source, rules, config)
        finally:
            source.close()
        if once and not as_json:
            from zgtool.dcgm.render import watch_table

            console.print(watch_table(state))
        result = make_result("dcgm.watch", result_data(state), target=state.source)
        emit_result(result, as_json=as_json, out=record)
        if fail_on_alert and state.evaluator.history:
            fired = sorted({a.rule for a in state.evaluator.history})
            raise VerdictFailed(f"alerts fired: {', '.join(fired)}")

    app.add_typer(dcgm_app, name="dcgm")

    @app.command("defrag", help=DEFRAG_HELP)
    def defrag_cmd(
        engine: str = typer.Option(..., "--engine", help="zgtool engine URL, e.g. http://127.0.0.1:8000."),
        dry_run: bool = typer.Option(False, "--dry-run", help="Report what would be done; change nothing."),
        drop_prefix_cache: bool = typer.Option(False, "--drop-prefix-cache",
                                               help="Also drop evictable prefix-cache blocks."),
        admin_key: str = typer.Option(None, "--admin-key", help="Admin key (default: $ZGTOOL_ADMIN_KEY).",
                                      show_default=False),
        timeout: float = typer.Option(60.0, "--timeout-s", help="Seconds to wait for the engine."),
        timeout_old: float | None = typer.Option(None, "--timeout", hidden=True, help="Old name of --timeout-s."),
        as_json: bool = typer.Option(False, "--json", help="Print the defrag result as JSON."),
        out: Path = typer.Option(None, "-o", "--output", help="Write the defrag result here."),
        insecure: bool = typer.Option(False, "--insecure", "-k", help="Do not verify TLS certificates."),
        cacert: Path = typer.Option(None, "--cacert", help="CA bundle for a self-signed engine (serve --tls)."),
    ) -> None:
        from zgtool.dcgm.defrag import ADMIN_KEY_ENV, DefragRequest, run_defrag
        from zgtool.output import console, emit_result
        from zgtool.results import make_result
        from zgtool.tlsverify import verify_setting

        key = admin_key or os.environ.get(ADMIN_KEY_ENV) or None
        url = engine if "://" in engine else "http://" + engine
        data = run_defrag(DefragRequest(url, dry_run=dry_run, drop_prefix_cache=drop_prefix_cache,
                                        admin_key=key, timeout_s=timeout if timeout_old is None else timeout_old,
                                        verify=verify_setting(insecure, cacert)))
        if not as_json:
            from zgtool.dcgm.render import defrag_table

            console.print(defrag_table(data))
        result = make_result("defrag", data, command=_redacted_command(), target={"url": url})
        emit_result(result, as_json=as_json, out=out)


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

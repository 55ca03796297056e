"""`zgtool probe tcp|tls|headers|stream TARGET` and `zgtool probe --target NAME` (all four).

Wiring only: the probes live in zgtool.probes.*, rendering in zgtool.probes.render. Every probe command
turns its shared options into one ProbeOptions (parse_probe_options owns their checks).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import typer

from zgtool.commands import vocabulary as vocab

TARGET_HELP = "A target name from zgtool.toml (see `zgtool targets`) or a URL."
EXAMPLES = """

\b
Examples:
  zgtool probe --target http://127.0.0.1:8080 -o probe.json
  zgtool probe http://127.0.0.1:8080          (a URL first is short for --target URL)
  zgtool probe headers https://api.anthropic.com --timeout-s 5
  zgtool probe stream local --max-tokens 32 --json
"""


# -- the declarations shared by the probe commands (zgtool.commands.vocabulary) ---------------------------
CONFIG = vocab.config(help="zgtool.toml to read.")
API = vocab.api(help="anthropic | openai (overrides the target's).")
MODEL = vocab.model(help="Model name to request (overrides the target's).")
JSON = vocab.as_json(help="Print the versioned JSON result to stdout.")
OUTPUT = vocab.output(help="Write the JSON result to FILE.")
TIMEOUT_S = vocab.timeout_s(10.0, help="Per-step network timeout, seconds.")
STREAM_TIMEOUT_S = vocab.timeout_s(30.0, help="Network timeout per read, seconds.")
TIMEOUT_OLD = vocab.timeout_old()
INSECURE = vocab.insecure(help="Do not verify the TLS certificate.")
HEADER = vocab.header()
METHOD = typer.Option(None, "--method", help="Send METHOD instead of the API request.")
PATH = typer.Option(None, "--path", help="Request PATH instead of the API endpoint.")


@dataclass(frozen=True)
class ProbeOptions:
    """What every probe shares: the target (a name or URL, resolved by resolve()), what to ask it, how
    long to wait, and where the result goes."""

    target: str | None = None
    config: Path | None = None
    api: str | None = None
    model: str | None = None
    timeout_s: float = 10.0
    insecure: bool = False
    as_json: bool = False
    out: Path | None = None
    headers: Mapping[str, str] = field(default_factory=dict)    # -H: on every request the probe sends (secret)

    def resolve(self, *, with_api: bool = True) -> Any:
        from zgtool.targets import resolve

        assert self.target is not None
        return resolve(self.target, self.config, api=self.api if with_api else None,
                       model=self.model if with_api else None, headers=self.headers)

    def resolve_detected(self) -> tuple[Any, Any]:
        """The target, its API and model detected (zgtool.latency.wire.detect) when a bare URL comes without
        --api/--model: a model only when a 1-token request with it succeeds, the engine behind named. The
        detection is said on stderr (not with --json) and returned for the result."""
        t = self.resolve()
        assert self.target is not None
        if "://" not in self.target or (self.api is not None and self.model is not None):
            return t, None
        from zgtool.errors import TargetUnreachable
        from zgtool.latency.wire.detect import NotAnLlmApi, detect

        try:
            t, found = detect(t, api_known=self.api is not None, model_known=self.model is not None,
                              timeout_s=self.timeout_s, verify=not self.insecure)
        except NotAnLlmApi as exc:
            return t, exc       # the probe still runs and writes what it finds; emit then exits 5 with this
        except TargetUnreachable:
            return t, None      # silent: the probe itself reports what it finds
        if found is not None and not self.as_json:
            from zgtool.output import err_console

            engine = f"; engine {found.engine.label()} ({found.engine.evidence})" if found.engine else ""
            err_console.print(f"detected the {found.api} API, model {found.model!r} ({found.how}){engine}; "
                              "--api/--model override", highlight=False)
        return t, found

    def emit(self, kind: str, data: Any, target: Any, renderer: Any, detected: Any = None) -> None:
        from zgtool.latency.wire.detect import NotAnLlmApi
        from zgtool.output import console, emit_result
        from zgtool.results import make_result

        not_llm = detected if isinstance(detected, NotAnLlmApi) else None
        detected = None if not_llm is not None else detected
        public = target.public() if target is not None else None
        if public is not None and detected is not None:
            public = {**public, "detected": detected.public()}
        result = make_result(kind, data, target=public)
        emit_result(result, as_json=self.as_json, out=self.out,
                    render=None if self.as_json else lambda: renderer(data, console))
        if not_llm is not None:    # a probe of a web server that answers no LLM route is no pass
            raise not_llm


def parse_probe_options(target: str | None = None, *, config: Path | None = None, api: str | None = None,
                        model: str | None = None, as_json: bool = False, out: Path | None = None,
                        timeout: float = 10.0, timeout_old: float | None = None, insecure: bool = False,
                        needs_target: str | None = None, read: Path | None = None,
                        read_excludes: str | None = None, header: Sequence[str] = ()) -> ProbeOptions:
    """The shared options -> ProbeOptions. `needs_target`: the command's words when neither a TARGET nor
    --read was given; `read_excludes`: its words when --read came with what it excludes (a TARGET, --pcap)."""
    from zgtool.errors import UsageError

    timeout_s = vocab.positive_timeout(timeout, timeout_old)
    if read is not None and read_excludes is not None:
        raise UsageError(read_excludes)
    if read is None and target is None and needs_target is not None:
        raise UsageError(needs_target)
    return ProbeOptions(target=target, config=config, api=vocab.check_api(api), model=model, timeout_s=timeout_s,
                        insecure=insecure, as_json=as_json, out=out, headers=vocab.headers(list(header)))


def probe_root(
    ctx: typer.Context,
    target: str = typer.Option(None, "--target", help="Run every probe on this target. " + TARGET_HELP),
    config: Path = CONFIG, api: str = API, model: str = MODEL, as_json: bool = JSON, out: Path = OUTPUT,
    timeout: float = TIMEOUT_S, timeout_old: float | None = TIMEOUT_OLD, insecure: bool = INSECURE,
    header: list[str] = HEADER,
    max_tokens: int = typer.Option(64, "--max-tokens", help="Tokens to request for the stream probe."),
    verbose: bool = typer.Option(False, "--verbose", "-v", help="With --target: every probe's full tables, not "
                                                                "the one-screen summary."),
) -> None:
    """Run one probe (tcp, tls, headers, stream), or all of them with --target NAME."""
    if ctx.invoked_subcommand is not None:
        return
    opts = parse_probe_options(target, config=config, api=api, model=model, as_json=as_json, out=out,
                               timeout=timeout, timeout_old=timeout_old, insecure=insecure, header=header,
                               needs_target="name a probe (tcp, tls, headers, stream) or pass --target NAME "
                                            "to run them all")
    from zgtool.probes.combined import probe_all
    from zgtool.probes.render import render_all
    from zgtool.probes.render_summary import render_summary

    t, found = opts.resolve_detected()
    opts.emit("probe.all", probe_all(t, timeout_s=opts.timeout_s, insecure=opts.insecure, max_tokens=max_tokens,
                                     engine=getattr(found, "engine", None)),
              t, render_all if verbose else render_summary, found)


def probe_tcp_cmd(
    target: str = typer.Argument(None, help=TARGET_HELP + " Not needed with --read."),
    read: Path = typer.Option(None, "--read", help="Analyse every TCP stream of an existing pcap/pcapng."),
    allow_truncated: bool = typer.Option(False, "--allow-truncated",
                                         help="With --read: analyse the complete records of a truncated capture "
                                              "(noted) instead of exiting 2."),
    pcap: Path = typer.Option(None, "--pcap", help="Save the live capture to this pcap file."),
    require_capture: bool = typer.Option(False, "--require-capture",
                                         help="Exit 4 instead of falling back when capture is not permitted."),
    iface: str = typer.Option(None, "--iface", help="Capture interface (default: the route's)."),
    method: str = METHOD, path: str = PATH, config: Path = CONFIG, api: str = API, model: str = MODEL,
    as_json: bool = JSON, out: Path = OUTPUT, timeout: float = TIMEOUT_S, timeout_old: float | None = TIMEOUT_OLD,
    header: list[str] = HEADER,
) -> None:
    """Capture the connection and first request (SYN/SYN-ACK RTT, TTL/hops, options, retransmissions)."""
    from zgtool.probes import render

    opts = parse_probe_options(target, config=config, api=api, model=model, as_json=as_json, out=out,
                               timeout=timeout, timeout_old=timeout_old, read=read, header=header,
                               read_excludes="--read analyses a capture file; do not also give a TARGET or --pcap"
                               if target is not None or pcap is not None else None,
                               needs_target="probe tcp needs a TARGET (name or URL) or --read FILE")
    if read is not None:
        from zgtool.probes.pcap import analyse_packets, read_capture

        analysis = analyse_packets(read_capture(read, allow_truncated=allow_truncated), source=str(read), mode="read")
        opts.emit("probe.tcp", analysis, None, render.render_pcap)
        return
    from zgtool.probes.tcp import probe_tcp

    t, found = opts.resolve_detected()
    result = probe_tcp(t, timeout_s=opts.timeout_s, pcap_out=pcap, require_capture=require_capture, iface=iface,
                       method=method, path=path)
    opts.emit("probe.tcp", result, t, render.render_tcp, found)


def probe_tls_cmd(
    target: str = typer.Argument(..., help=TARGET_HELP),
    sni: str = typer.Option(None, "--sni", help="Server name to send (default: the URL's host)."),
    config: Path = CONFIG, as_json: bool = JSON, out: Path = OUTPUT, timeout: float = TIMEOUT_S,
    timeout_old: float | None = TIMEOUT_OLD,
) -> None:
    """TLS version, cipher, ALPN, certificate, handshake time and a JA4S-style fingerprint."""
    from zgtool.probes import render
    from zgtool.probes.tls import probe_tls

    opts = parse_probe_options(target, config=config, as_json=as_json, out=out, timeout=timeout,
                               timeout_old=timeout_old)
    t = opts.resolve(with_api=False)
    opts.emit("probe.tls", probe_tls(t, timeout_s=opts.timeout_s, sni=sni), t, render.render_tls)


def probe_headers_cmd(
    target: str = typer.Argument(None, help=TARGET_HELP + " Not needed with --read."),
    read: Path = typer.Option(None, "--read", help="Analyse recorded responses instead: a HAR file, "
                                                    "`curl -sD-` or `curl -v` output, or raw header text."),
    method: str = METHOD, path: str = PATH,
    no_error_probe: bool = typer.Option(False, "--no-error-probe",
                                        help="Do not send the one malformed request that shows who parses "
                                             "requests first."),
    config: Path = CONFIG, api: str = API, model: str = MODEL, as_json: bool = JSON, out: Path = OUTPUT,
    timeout: float = TIMEOUT_S, timeout_old: float | None = TIMEOUT_OLD, insecure: bool = INSECURE,
    header: list[str] = HEADER,
) -> None:
    """One minimal request (and one malformed one); every response header matched against the signature
    database, plus behavioural evidence of a hop when the headers are silent."""
    from zgtool.probes import render

    opts = parse_probe_options(target, config=config, api=api, model=model, as_json=as_json, out=out,
                               timeout=timeout, timeout_old=timeout_old, insecure=insecure, read=read,
                               header=header, read_excludes="--read analyses a recorded file; do not also give a TARGET"
                               if target is not None else None,
                               needs_target="probe headers needs a TARGET (name or URL) or --read FILE")
    if read is not None:
        from zgtool.probes.headerfile import read_headers_file

        opts.emit("probe.headers", read_headers_file(read), None, render.render_headers_read)
        return
    from zgtool.probes.headers import add_detected_engine, probe_headers

    t, found = opts.resolve_detected()
    result = probe_headers(t, method=method, path=path, timeout_s=opts.timeout_s, insecure=opts.insecure,
                           probe_errors=not no_error_probe)
    add_detected_engine(result.analysis, getattr(found, "engine", None))
    opts.emit("probe.headers", result, t, render.render_headers, found)


def probe_stream_cmd(
    target: str = typer.Argument(..., help=TARGET_HELP),
    max_tokens: int = typer.Option(64, "--max-tokens", help="Tokens to request."),
    config: Path = CONFIG, api: str = API, model: str = MODEL, as_json: bool = JSON, out: Path = OUTPUT,
    timeout: float = STREAM_TIMEOUT_S, timeout_old: float | None = TIMEOUT_OLD, insecure: bool = INSECURE,
    header: list[str] = HEADER,
) -> None:
    """Stream one answer, time every chunk, and flag a buffering intermediary."""
    from zgtool.errors import UsageError
    from zgtool.probes import render
    from zgtool.probes.stream import probe_stream

    opts = parse_probe_options(target, config=config, api=api, model=model, as_json=as_json, out=out,
                               timeout=timeout, timeout_old=timeout_old, insecure=insecure, header=header)
    if max_tokens < 1:
        raise UsageError(f"--max-tokens must be >= 1, not {max_tokens}")
    t, found = opts.resolve_detected()
    result = probe_stream(t, max_tokens=max_tokens, timeout_s=opts.timeout_s, insecure=opts.insecure)
    opts.emit("probe.stream", result, t, render.render_stream, found)


def register(app: typer.Typer) -> None:
    probe_app = typer.Typer(help="Is there a gateway between you and the model, what is it, what does it cost?"
                            + EXAMPLES)
    probe_app.callback(invoke_without_command=True)(probe_root)
    probe_app.command("tcp", epilog="""Examples:\n\n  zgtool probe tcp http://127.0.0.1:8000 --pcap run.pcap\n\n  zgtool probe tcp --read capture.pcapng\n""")(probe_tcp_cmd)
    probe_app.command("tls", epilog="""Examples:\n\n  zgtool probe tls https://api.anthropic.com\n\n  zgtool probe tls https://127.0.0.1:8443 --sni engine.local -o tls.json\n""")(probe_tls_cmd)
    probe_app.command("headers", epilog="""Examples:\n\n  zgtool probe headers http://127.0.0.1:8080\n\n  zgtool probe headers --read session.har\n""")(probe_headers_cmd)
    probe_app.command("stream", epilog="""Examples:\n\n  zgtool probe stream http://127.0.0.1:8080 --max-tokens 128\n\n  zgtool probe stream api --json\n""")(probe_stream_cmd)
    app.add_typer(probe_app, name="probe")

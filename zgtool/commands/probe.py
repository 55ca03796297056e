"""`zgtool probe tcp|tls|headers|stream TARGET` and `zgtool probe --target NAME` (all four).

Wiring only: the probes live in zgtool.probes.*, rendering in zgtool.probes.render.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

TARGET_HELP = "A target name from zgtool.toml (see `zgtool targets`) or a URL."
EXAMPLES = """

\b
Examples:
  zgtool probe --target http://127.0.0.1:8080 -o probe.json
  zgtool probe headers https://api.anthropic.com --timeout-s 5
  zgtool probe stream local --max-tokens 32 --json
"""


def _target(spec: str, config: Path | None, api: str | None, model: str | None) -> Any:
    from zgtool.errors import UsageError
    from zgtool.targets import resolve

    if api is not None and api not in ("anthropic", "openai"):
        raise UsageError(f"--api must be anthropic or openai, not {api!r}")
    return resolve(spec, config, api=api, model=model)


def _emit(kind: str, data: Any, target: Any, renderer: Any, as_json: bool, out: Path | None) -> None:
    from zgtool.output import console, emit_result
    from zgtool.results import make_result

    result = make_result(kind, data, target=target.public() if target is not None else None)
    if not as_json:
        renderer(data, console)
    emit_result(result, as_json=as_json, out=out)


def _check_timeout(timeout: float, old: float | None = None) -> float:
    """--timeout-s, or the old spelling --timeout (hidden) when that was given."""
    from zgtool.errors import UsageError

    timeout = old if old is not None else timeout
    if not timeout > 0:
        raise UsageError(f"--timeout-s must be > 0 seconds, not {timeout}")
    return timeout


def register(app: typer.Typer) -> None:
    probe_app = typer.Typer(help="Is there a gateway between you and the model, what is it, what does it cost?"
                            + EXAMPLES)

    config_opt = typer.Option(None, "--config", help="zgtool.toml to read.")
    api_opt = typer.Option(None, "--api", help="anthropic | openai (overrides the target's).")
    model_opt = typer.Option(None, "--model", help="Model name to request (overrides the target's).")
    json_opt = typer.Option(False, "--json", help="Print the versioned JSON result to stdout.")
    out_opt = typer.Option(None, "-o", "--output", help="Write the JSON result to FILE.")
    timeout_opt = typer.Option(10.0, "--timeout-s", help="Per-step network timeout, seconds.")
    old_timeout_opt = typer.Option(None, "--timeout", hidden=True, help="Old name of --timeout-s.")
    insecure_opt = typer.Option(False, "-k", "--insecure", help="Do not verify the TLS certificate.")

    @probe_app.callback(invoke_without_command=True)
    def probe_root(
        ctx: typer.Context,
        target: str = typer.Option(None, "--target", help="Run every probe on this target. " + TARGET_HELP),
        config: Path = config_opt, api: str = api_opt, model: str = model_opt,
        as_json: bool = json_opt, out: Path = out_opt, timeout: float = timeout_opt, timeout_old: float | None = old_timeout_opt,
        insecure: bool = insecure_opt,
        max_tokens: int = typer.Option(64, "--max-tokens", help="Tokens to request for the stream probe."),
    ) -> None:
        """Run one probe (tcp, tls, headers, stream), or all of them with --target NAME."""
        if ctx.invoked_subcommand is not None:
            return
        from zgtool.errors import UsageError

        if target is None:
            raise UsageError("name a probe (tcp, tls, headers, stream) or pass --target NAME to run them all")
        timeout = _check_timeout(timeout, timeout_old)
        from zgtool.probes.combined import probe_all
        from zgtool.probes.render import render_all

        t = _target(target, config, api, model)
        _emit("probe.all", probe_all(t, timeout_s=timeout, insecure=insecure, max_tokens=max_tokens), t,
              render_all, as_json, out)

    @probe_app.command("tcp")
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
        method: str = typer.Option(None, "--method", help="Send METHOD instead of the API request."),
        path: str = typer.Option(None, "--path", help="Request PATH instead of the API endpoint."),
        config: Path = config_opt, api: str = api_opt, model: str = model_opt,
        as_json: bool = json_opt, out: Path = out_opt, timeout: float = timeout_opt, timeout_old: float | None = old_timeout_opt,
    ) -> None:
        """Capture the connection and first request (SYN/SYN-ACK RTT, TTL/hops, options, retransmissions)."""
        from zgtool.errors import UsageError
        from zgtool.probes import render

        timeout = _check_timeout(timeout, timeout_old)
        if read is not None:
            if target is not None or pcap is not None:
                raise UsageError("--read analyses a capture file; do not also give a TARGET or --pcap")
            from zgtool.probes.pcap import analyse_packets, read_capture

            analysis = analyse_packets(read_capture(read, allow_truncated=allow_truncated), source=str(read),
                                       mode="read")
            _emit("probe.tcp", analysis, None, render.render_pcap, as_json, out)
            return
        if target is None:
            raise UsageError("probe tcp needs a TARGET (name or URL) or --read FILE")
        from zgtool.probes.tcp import probe_tcp

        t = _target(target, config, api, model)
        result = probe_tcp(t, timeout_s=timeout, pcap_out=pcap, require_capture=require_capture,
                           iface=iface, method=method, path=path)
        _emit("probe.tcp", result, t, render.render_tcp, as_json, out)

    @probe_app.command("tls")
    def probe_tls_cmd(
        target: str = typer.Argument(..., help=TARGET_HELP),
        sni: str = typer.Option(None, "--sni", help="Server name to send (default: the URL's host)."),
        config: Path = config_opt, as_json: bool = json_opt, out: Path = out_opt, timeout: float = timeout_opt, timeout_old: float | None = old_timeout_opt,
    ) -> None:
        """TLS version, cipher, ALPN, certificate, handshake time and a JA4S-style fingerprint."""
        from zgtool.probes import render
        from zgtool.probes.tls import probe_tls

        timeout = _check_timeout(timeout, timeout_old)
        t = _target(target, config, None, None)
        _emit("probe.tls", probe_tls(t, timeout_s=timeout, sni=sni), t, render.render_tls, as_json, out)

    @probe_app.command("headers")
    def probe_headers_cmd(
        target: str = typer.Argument(None, help=TARGET_HELP + " Not needed with --read."),
        read: Path = typer.Option(None, "--read", help="Analyse recorded responses instead: a HAR file, "
                                                        "`curl -sD-` or `curl -v` output, or raw header text."),
        method: str = typer.Option(None, "--method", help="Send METHOD instead of the API request."),
        path: str = typer.Option(None, "--path", help="Request PATH instead of the API endpoint."),
        no_error_probe: bool = typer.Option(False, "--no-error-probe",
                                            help="Do not send the one malformed request that shows who parses "
                                                 "requests first."),
        config: Path = config_opt, api: str = api_opt, model: str = model_opt,
        as_json: bool = json_opt, out: Path = out_opt, timeout: float = timeout_opt, timeout_old: float | None = old_timeout_opt,
        insecure: bool = insecure_opt,
    ) -> None:
        """One minimal request (and one malformed one); every response header matched against the signature
        database, plus behavioural evidence of a hop when the headers are silent."""
        from zgtool.errors import UsageError
        from zgtool.probes import render

        timeout = _check_timeout(timeout, timeout_old)
        if read is not None:
            if target is not None:
                raise UsageError("--read analyses a recorded file; do not also give a TARGET")
            from zgtool.probes.headerfile import read_headers_file

            _emit("probe.headers", read_headers_file(read), None, render.render_headers_read, as_json, out)
            return
        if target is None:
            raise UsageError("probe headers needs a TARGET (name or URL) or --read FILE")
        from zgtool.probes.headers import probe_headers

        t = _target(target, config, api, model)
        result = probe_headers(t, method=method, path=path, timeout_s=timeout, insecure=insecure,
                               probe_errors=not no_error_probe)
        _emit("probe.headers", result, t, render.render_headers, as_json, out)

    @probe_app.command("stream")
    def probe_stream_cmd(
        target: str = typer.Argument(..., help=TARGET_HELP),
        max_tokens: int = typer.Option(64, "--max-tokens", help="Tokens to request."),
        config: Path = config_opt, api: str = api_opt, model: str = model_opt,
        as_json: bool = json_opt, out: Path = out_opt,
        timeout: float = typer.Option(30.0, "--timeout-s", help="Network timeout per read, seconds."),
        timeout_old: float | None = typer.Option(None, "--timeout", hidden=True, help="Old name of --timeout-s."),
        insecure: bool = insecure_opt,
    ) -> None:
        """Stream one answer, time every chunk, and flag a buffering intermediary."""
        from zgtool.errors import UsageError
        from zgtool.probes import render
        from zgtool.probes.stream import probe_stream

        timeout = _check_timeout(timeout, timeout_old)
        if max_tokens < 1:
            raise UsageError(f"--max-tokens must be >= 1, not {max_tokens}")
        t = _target(target, config, api, model)
        result = probe_stream(t, max_tokens=max_tokens, timeout_s=timeout, insecure=insecure)
        _emit("probe.stream", result, t, render.render_stream, as_json, out)

    app.add_typer(probe_app, name="probe")

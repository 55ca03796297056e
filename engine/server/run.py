"""Start-up and shutdown of `zgtool serve`: engine + ASGI app on uvicorn (httptools, uvloop).

SIGTERM / Ctrl-C: stop listening, answer new requests on open connections with 529,
let in-flight requests finish within --grace-s, stop the engine, exit 0. A second
Ctrl-C forces the exit.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import signal
import socket
import tempfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import uvicorn

from zgtool.engine.server.config import ServeConfig
from zgtool.engine.server.tls import TlsFiles
from zgtool.errors import MissingCapability, UsageError

ENDPOINTS = ("POST /v1/messages", "POST /v1/messages/count_tokens", "POST /v1/chat/completions",
             "GET /v1/models", "GET /health", "GET /metrics", "GET /admin/kv", "POST /admin/defrag")


class ZgServer(uvicorn.Server):
    """uvicorn.Server that marks the app as draining on a signal and exits 0 afterwards."""

    def __init__(self, config: uvicorn.Config, app: Any) -> None:
        super().__init__(config)
        self.zg_app = app

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        original = {sig: signal.signal(sig, self.handle_exit) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield
        finally:
            for sig, handler in original.items():
                signal.signal(sig, handler)
        # uvicorn re-raises the captured signal here; a shutdown that was asked for and
        # completed is a success, so we do not.

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        if self.config.ssl is None:
            await super().startup(sockets)
            return
        # asyncio/uvloop hold a TLS handshake 60 s; bound it by the header deadline instead.
        loop: Any = asyncio.get_running_loop()
        loop.create_server = functools.partial(loop.create_server,
                                               ssl_handshake_timeout=self.zg_app.cfg.header_timeout_s)
        try:
            await super().startup(sockets)
        finally:
            del loop.create_server

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        """Our order, not uvicorn's: stop accepting, close idle connections, let requests finish
        within --grace-s, abort the rest with the API's own error (event), then let uvicorn
        finish, so it never has request tasks left to cancel."""
        self.zg_app.draining = True
        for server in getattr(self, "servers", []):
            server.close()
        for sock in sockets or []:
            sock.close()
        for connection in list(self.server_state.connections):
            connection.shutdown()
        await self.zg_app.drain(self.zg_app.cfg.grace_s, lambda: self.force_exit)
        await super().shutdown(sockets)

    def handle_exit(self, sig: int, frame: Any) -> None:
        self.zg_app.draining = True
        if sig == signal.SIGINT:        # drained cleanly, but the CLI still exits 130 for Ctrl-C
            from zgtool.errors import mark_interrupted

            mark_interrupted(sig)
        super().handle_exit(sig, frame)


@dataclass
class Built:
    app: Any
    engine: Any
    tls: TlsFiles | None
    sock: socket.socket
    config: ServeConfig

    @property
    def port(self) -> int:
        return int(self.sock.getsockname()[1])

    @property
    def url(self) -> str:
        host = self.config.host
        host = f"[{host}]" if ":" in host else host
        return f"{self.config.scheme}://{host}:{self.port}"


def bind(host: str, port: int) -> socket.socket:
    """Bind before loading the model: a taken port is a one-line error, not a late crash."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise UsageError(f"cannot listen on {host}:{port}: {exc.strerror}; pick another --port") from exc
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


def _engine_config(cfg: ServeConfig) -> Any:
    from zgtool.engine import EngineConfig
    from zgtool.engine.config import server_threads

    return EngineConfig(
        model=cfg.model, device=cfg.device, dtype=cfg.dtype, max_model_len=cfg.max_model_len,
        max_num_seqs=cfg.max_num_seqs, max_waiting=cfg.max_waiting,
        kv_memory_bytes=cfg.kv_memory_mb * 1024 * 1024 if cfg.kv_memory_mb else None,
        batch_window_ms=cfg.batch_window_ms, deterministic=cfg.deterministic,
        num_threads=server_threads(cfg.num_threads),
    )


def build(cfg: ServeConfig, sock: socket.socket | None = None) -> Built:
    """Everything but the event loop: TLS files, keys, policy, engine, app."""
    from zgtool.engine import Engine
    from zgtool.engine.errors import EngineError, ModelUnavailable
    from zgtool.engine.server import tls as tlsmod
    from zgtool.engine.server.accesslog import AccessLog
    from zgtool.engine.server.admission import Admission
    from zgtool.engine.server.app import ServerApp
    from zgtool.engine.server.safety import load_policy
    from zgtool.http.keys import load_keys

    tls_files = None
    if cfg.tls == "self-signed":
        tls_files = tlsmod.self_signed(cfg.tls_dir or Path(tempfile.mkdtemp(prefix="zgtool-tls-")))
    elif cfg.tls == "files":
        assert cfg.tls_cert is not None and cfg.tls_key is not None
        tls_files = tlsmod.given(cfg.tls_cert, cfg.tls_key)
    keys = load_keys(cfg.keys) if cfg.keys is not None else None
    policy = load_policy(cfg.safety_policy) if cfg.safety_policy is not None else None
    sock = sock or bind(cfg.host, cfg.port)
    try:
        engine = Engine(_engine_config(cfg))
    except ModelUnavailable as exc:
        sock.close()
        raise MissingCapability(f"cannot load model {cfg.model!r}: {exc}") from exc
    except EngineError as exc:
        sock.close()
        raise UsageError(f"cannot load model {cfg.model!r}: {exc}") from exc
    access = AccessLog(cfg.access_log) if cfg.access_log is not None else None
    app = ServerApp(engine, cfg, Admission(keys), policy, access)
    if cfg.otlp_endpoint is not None:
        from zgtool import __version__
        from zgtool.engine.server.tracing import SpanExporter

        app.tracer = SpanExporter(cfg.otlp_endpoint, __version__)
    return Built(app, engine, tls_files, sock, cfg)


def make_server(built: Built) -> ZgServer:
    from zgtool.engine.server.protocol import protocol_class

    cfg = built.config
    built.app.disconnect_hook = True
    ucfg = uvicorn.Config(
        built.app,
        loop="uvloop",
        http=protocol_class(cfg.header_timeout_s, cfg.body_timeout_s, write_timeout_s=cfg.write_timeout_s,
                            max_header_bytes=cfg.max_header_bytes, max_headers=cfg.max_headers),
        lifespan="on",
        timeout_keep_alive=int(max(1, cfg.keep_alive_s)),
        # drain() has already waited --grace-s and ended every request; this only bounds
        # connections that are still flushing.
        timeout_graceful_shutdown=5,
        ssl_certfile=str(built.tls.cert_path) if built.tls else None,
        ssl_keyfile=str(built.tls.key_path) if built.tls else None,
        log_level=cfg.log_level,
        access_log=False,
        server_header=False,     # the app sends Server: zgtool-engine/<version>
        proxy_headers=False,     # an engine is not behind a trusted proxy by default; saves a wrapper
        backlog=2048,
    )
    server = ZgServer(ucfg, built.app)
    built.app.request_tasks = server.server_state.tasks
    return server


def startup_rows(built: Built) -> list[tuple[str, str]]:
    e = built.engine
    cfg = built.config
    kv_tokens = e.num_kv_blocks * e.block_size
    kv_bytes = e.num_kv_blocks * getattr(e, "kv_bytes_per_block", 0)
    kv = f"{e.num_kv_blocks} blocks x {e.block_size} tokens = {kv_tokens} tokens"
    kv += f" ({kv_bytes / 2**20:.1f} MiB)" if kv_bytes else " (null backend: bookkeeping only)"
    adm = built.app.admission
    if adm.keys is None:
        keys = "OPEN: no --keys file, every request is admitted"
    else:
        keys = f"{len(adm.keys.keys)} keys, tiers: {', '.join(adm.keys.tiers) or '-'}; admin keys: {len(adm.keys.admin_digests)}"
    rows = [
        ("model", model_row(e)),
        ("device", str(e.device)),
        ("dtype", dtype_row(e)),
        ("threads", threads_row(e, cfg.num_threads)),
        ("context", f"{e.max_model_len} tokens"),
        ("KV pool", kv),
        ("listening", built.url),
        ("endpoints", ", ".join(ENDPOINTS)),
        ("served models", ", ".join(dict.fromkeys(cfg.served_names))),
        ("keys", keys),
        ("safety policy", str(cfg.safety_policy) if cfg.safety_policy else "none"),
        ("batching window", f"{cfg.batch_window_ms:g} ms"),
        ("stream interval", f"{cfg.stream_interval} token(s) per event"),
    ]
    if built.tls is not None:
        rows.append(("TLS cert", str(built.tls.cert_path)))
        rows.append(("TLS sha256", built.tls.sha256_fingerprint))
    if cfg.access_log:
        rows.append(("access log", str(cfg.access_log)))
    return rows


def model_row(e: Any) -> str:
    """The model line of the banner: name, where it came from, and loud notes."""
    text = str(e.model_name)
    from zgtool.engine.gguf_convert import PACKAGED

    if text in PACKAGED:
        from zgtool.engine.gguf_convert import ensure_converted

        text += f" ({PACKAGED[text].filename} from {PACKAGED[text].distribution}, as {ensure_converted(text)})"
    if getattr(e, "is_dummy", False):
        text += " (random weights: output text is meaningless)"
    tok = getattr(e, "tokenizer", None)
    if tok is not None and getattr(tok, "has_chat_template", True) is False:
        text += " — WARNING: no chat template (chat requests use plain 'role: content' lines)"
    return text


def dtype_row(e: Any) -> str:
    from zgtool.engine.config import cpu_native_bf16

    if e.config.dtype != "auto":
        return f"{e.dtype} (--dtype {e.config.dtype})"
    if str(e.device).startswith("cuda"):
        return f"{e.dtype} (auto: CUDA)"
    why = "CPU has native bf16" if cpu_native_bf16() else "CPU has no native bf16"
    return f"{e.dtype} (auto: {why})"


def threads_row(e: Any, requested: int | None) -> str:
    import torch

    from zgtool.engine.config import SMALL_BOX_CPUS, available_cpus

    how = "--num-threads" if requested else (
        f"default: all CPUs up to {SMALL_BOX_CPUS}" if available_cpus() <= SMALL_BOX_CPUS
        else "default: all CPUs but one, which the I/O loop keeps")
    return f"{torch.get_num_threads()} torch compute thread(s) of {available_cpus()} CPUs ({how})"


def print_startup(built: Built) -> None:
    from rich.console import Console

    console = Console()      # the terminal's width (80 when piped); values fold, keys never wrap
    console.print(startup_table(built))
    console.file.flush()


def startup_table(built: Built) -> Any:
    from rich import box
    from rich.table import Table

    table = Table(title=f"zgtool serve — {built.url}", title_justify="left", show_header=False,
                  box=box.SIMPLE, pad_edge=False)
    table.add_column(style="bold", no_wrap=True)
    table.add_column(overflow="fold")
    for k, v in startup_rows(built):
        table.add_row(k, v)
    return table


def serve(cfg: ServeConfig) -> int:
    """Blocking: run until SIGTERM/Ctrl-C; 0 after a clean shutdown."""
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    built = build(cfg)
    server = make_server(built)
    print_startup(built)
    try:
        server.run(sockets=[built.sock])
    finally:
        built.sock.close()
    if not server.started:
        raise MissingCapability("the server failed to start; see the log above")
    return 0

"""Start-up and shutdown of `zgtool serve`: engine + ASGI app on uvicorn (httptools, uvloop).
The banner and the mapping of start-up errors to exit codes live in the serve command
(zgtool/commands/serve.py); this module raises the server's own errors (errors.py).

SIGTERM / Ctrl-C: stop listening, answer new requests on open connections with 529,
let in-flight requests finish within --grace-s, stop the engine, exit 0. A second
Ctrl-C forces the exit.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import gc
import logging
import shutil
import signal
import socket
import tempfile
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import uvicorn

from zgtool.engine.server.config import ServeConfig
from zgtool.engine.server.errors import ListenFailed, ModelLoadFailed, ServerNotStarted
from zgtool.engine.server.tls import TlsFiles


class ZgServer(uvicorn.Server):
    """uvicorn.Server that marks the app as draining on a signal and exits 0 afterwards."""

    def __init__(self, config: uvicorn.Config, app: Any) -> None:
        super().__init__(config)
        self.zg_app = app
        self.on_sigint: Callable[[int], None] | None = None   # the CLI's: exit 130 after draining

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
        if sig == signal.SIGINT and self.on_sigint is not None:  # drained cleanly, yet Ctrl-C exits 130
            self.on_sigint(sig)
        super().handle_exit(sig, frame)


@dataclass
class Built:
    app: Any
    engine: Any
    tls: TlsFiles | None
    sock: socket.socket
    config: ServeConfig
    scratch: Path | None = None     # a folder build() made (--tls self-signed without --tls-dir): close() removes it

    def close(self) -> None:
        """The listening socket closed and build()'s own temporary folder (a private key in it) removed."""
        self.sock.close()
        _remove_scratch(self.scratch)

    @property
    def port(self) -> int:
        return int(self.sock.getsockname()[1])

    @property
    def url(self) -> str:
        host = self.config.host
        host = f"[{host}]" if ":" in host else host
        return f"{self.config.scheme}://{host}:{self.port}"


def _remove_scratch(folder: Path | None) -> None:
    if folder is not None:
        shutil.rmtree(folder, ignore_errors=True)


def bind(host: str, port: int) -> socket.socket:
    """Bind before loading the model: a taken port is a one-line error, not a late crash."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise ListenFailed(f"cannot listen on {host}:{port}: {exc.strerror}; pick another --port") from exc
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
        num_threads=server_threads(cfg.num_threads), cuda_graphs=cfg.cuda_graphs,
    )


def build(cfg: ServeConfig, sock: socket.socket | None = None) -> Built:
    """Everything but the event loop: TLS files, keys, policy, engine, app."""
    from zgtool.engine import Engine
    from zgtool.engine.errors import EngineError, ModelUnavailable
    from zgtool.engine.server import tls as tlsmod
    from zgtool.engine.server.accesslog import AccessLog
    from zgtool.engine.server.admission import Admission
    from zgtool.engine.server.app import ServerApp
    from zgtool.engine.server.routes import table
    from zgtool.engine.server.safety import load_policy
    from zgtool.http.keys import load_keys

    tls_files = None
    scratch = None
    if cfg.tls == "self-signed":
        tls_dir = cfg.tls_dir
        if tls_dir is None:     # a folder of our own: the key lives as long as the server
            tls_dir = scratch = Path(tempfile.mkdtemp(prefix="zgtool-tls-"))
        tls_files = tlsmod.self_signed(tls_dir)
    elif cfg.tls == "files":
        assert cfg.tls_cert is not None and cfg.tls_key is not None
        tls_files = tlsmod.given(cfg.tls_cert, cfg.tls_key)
    try:
        keys = load_keys(cfg.keys) if cfg.keys is not None else None
        policy = load_policy(cfg.safety_policy) if cfg.safety_policy is not None else None
        sock = sock or bind(cfg.host, cfg.port)
    except BaseException:
        _remove_scratch(scratch)
        raise
    try:
        engine = Engine(_engine_config(cfg))
    except BaseException as exc:
        sock.close()
        _remove_scratch(scratch)
        if isinstance(exc, ModelUnavailable):
            raise ModelLoadFailed(f"cannot load model {cfg.model!r}: {exc}", missing=True) from exc
        if isinstance(exc, EngineError):
            raise ModelLoadFailed(f"cannot load model {cfg.model!r}: {exc}", missing=False) from exc
        raise
    access = AccessLog(cfg.access_log) if cfg.access_log is not None else None
    app = ServerApp(engine, cfg, Admission(keys), table(), policy, access)
    if cfg.otlp_endpoint is not None:
        from zgtool import __version__
        from zgtool.engine.server.tracing import SpanExporter

        app.tracer = SpanExporter(cfg.otlp_endpoint, __version__)
    return Built(app, engine, tls_files, sock, cfg, scratch)


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


# Serving's generation-0 collection threshold (CPython's default is 700). A request's objects die by
# reference counting when it ends, so allocations minus frees barely grow while serving; at 700 the
# young generation was still collected every ~20 requests, each collection walking the in-flight
# requests' objects and promoting them (gen-1 and gen-2 collections followed): 5,825 collections,
# 3.9 us per request at concurrency 32, none at this threshold (bench/serving_inproc.py, gc.callbacks).
SERVING_GC_GEN0_THRESHOLD = 10_000


def freeze_heap() -> None:
    """Move everything alive after start-up (modules, the model, the engine) out of the garbage
    collector's sight: a full collection then walks only what serving allocated, not the whole
    start-up heap (~90 ms per full collection on the null model, several per 100k requests:
    ~6 us per request; vLLM's freeze_gc_heap and SGLang's freeze_gc do the same); then collect the
    young generation only once SERVING_GC_GEN0_THRESHOLD more objects live than died."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(SERVING_GC_GEN0_THRESHOLD, *gc.get_threshold()[1:])


def serve(cfg: ServeConfig, on_ready: Callable[[Built], None] | None = None,
          on_sigint: Callable[[int], None] | None = None) -> int:
    """Blocking: run until SIGTERM/Ctrl-C; 0 after a clean shutdown. ``on_ready`` (the serve
    command's banner) runs once the model is loaded and the port bound; ``on_sigint`` when
    Ctrl-C starts the drain."""
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    built = build(cfg)
    try:
        server = make_server(built)
        freeze_heap()
        server.on_sigint = on_sigint
        if on_ready is not None:
            on_ready(built)
        server.run(sockets=[built.sock])
    finally:
        built.close()
    if not server.started:
        raise ServerNotStarted("the server failed to start; see the log above")
    return 0

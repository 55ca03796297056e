"""The server's frozen configuration (what `zgtool serve` parsed), validated once."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from zgtool.engine.config import DEFAULT_MODEL
from zgtool.errors import UsageError


@dataclass(frozen=True)
class ServeConfig:
    model: str = DEFAULT_MODEL
    host: str = "127.0.0.1"
    port: int = 8000
    # engine
    device: str = "auto"
    dtype: str = "auto"
    max_model_len: int | None = None
    max_num_seqs: int = 32
    max_waiting: int = 256
    kv_memory_mb: int | None = None
    batch_window_ms: float = 0.0
    deterministic: bool = False
    num_threads: int | None = None     # compute threads; None: engine/config.py server_threads
    cuda_graphs: bool = True           # --cuda-graphs on|off (engine/cuda_runner.py)
    # HTTP
    max_body_bytes: int = 8 * 1024 * 1024
    header_timeout_s: float = 10.0
    body_timeout_s: float = 30.0
    keep_alive_s: float = 5.0
    write_timeout_s: float = 30.0     # a client that stops reading this long is cut off (its request aborted)
    max_header_bytes: int = 32 * 1024  # request line + headers; over it: 431 (nginx: 4 x 8 KiB buffers)
    max_headers: int = 100
    stream_interval: int = 1
    stream_keepalive_s: float = 3.0    # a stream silent this long (queued, preempted) gets a keepalive
    grace_s: float = 10.0
    # TLS: "none" | "self-signed" | "files" (tls_cert + tls_key)
    tls: str = "none"
    tls_cert: Path | None = None
    tls_key: Path | None = None
    tls_dir: Path | None = None
    # admission, safety, logs
    keys: Path | None = None
    metrics_require_key: bool = False   # GET /metrics needs a key too (also [metrics] in keys.toml)
    safety_policy: Path | None = None
    access_log: Path | None = None
    log_level: str = "warning"
    otlp_endpoint: str | None = None    # OTLP/HTTP collector: one span per request (JSON encoding)

    def __post_init__(self) -> None:
        if not 0 <= self.port <= 65535:
            raise UsageError(f"--port must be in 0..65535, got {self.port}")
        if self.tls not in ("none", "self-signed", "files"):
            raise UsageError(f"--tls must be 'self-signed' (or give --tls-cert and --tls-key), not {self.tls!r}")
        if self.tls == "files" and (self.tls_cert is None or self.tls_key is None):
            raise UsageError("--tls-cert and --tls-key must be given together")
        if self.stream_interval < 1:
            raise UsageError("--stream-interval must be >= 1")
        if self.max_body_bytes < 1024:
            raise UsageError("--max-body-bytes must be >= 1024")
        if self.max_header_bytes < 1024 or self.max_headers < 8:
            raise UsageError("--max-header-bytes must be >= 1024 and --max-headers >= 8")
        if self.metrics_require_key and self.keys is None:
            raise UsageError("--metrics-key needs --keys (the keys that may scrape /metrics)")
        for name in ("header_timeout_s", "body_timeout_s", "keep_alive_s", "write_timeout_s", "grace_s",
                     "stream_keepalive_s"):
            if getattr(self, name) <= 0:
                raise UsageError(f"{name} must be > 0")
        if self.batch_window_ms < 0:
            raise UsageError("--batch-window-ms must be >= 0")
        if self.num_threads is not None and self.num_threads < 1:
            raise UsageError("--num-threads must be >= 1")
        if self.otlp_endpoint is not None and not self.otlp_endpoint.startswith(("http://", "https://")):
            raise UsageError(f"--otlp-endpoint must be an http(s) URL such as http://127.0.0.1:4318, "
                             f"not {self.otlp_endpoint!r}")
        if self.dtype not in ("auto", "float32", "bfloat16", "float16", "int8"):
            raise UsageError(f"--dtype must be auto, float32, bfloat16, float16 or int8, not {self.dtype!r}")

    @property
    def scheme(self) -> str:
        return "http" if self.tls == "none" else "https"

    @property
    def served_names(self) -> tuple[str, ...]:
        return (self.model, "default")

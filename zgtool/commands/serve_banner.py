"""The `zgtool serve` start-up banner: what is served, from where, with which settings.

Rendering only: every value comes from the built server (zgtool.engine.server.run.Built).
"""

from __future__ import annotations

import os
from typing import Any

ENDPOINTS = ("POST /v1/messages", "POST /v1/messages/count_tokens", "POST /v1/chat/completions",
             "GET /v1/models", "GET /health", "GET /metrics", "GET /admin/kv", "POST /admin/defrag")


def startup_rows(built: Any) -> list[tuple[str, str]]:
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
        ("kernels", kernels_row(e)),
        *([("CUDA graphs", graphs)] if (graphs := getattr(e.runner, "graph_status", None)) else []),
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
    if cfg.otlp_endpoint:
        rows.append(("OTLP traces", f"{cfg.otlp_endpoint} (one span per request, JSON)"))
    return rows


def kernels_row(e: Any) -> str:
    """on | off: <reason> | partial: ... (engine/cpu_kernels.py engine_status): ~3.9x slower off;
    with the ISA variant the kernels were built for, chosen once from the CPU's flags."""
    from zgtool.engine.kernel_report import kernel_report

    state, isa = kernel_report(e)
    if isa is None:
        return state
    from zgtool.engine.cpu_kernels import ISA_ENV

    how = f"forced by {ISA_ENV}" if os.environ.get(ISA_ENV) else "the best this CPU's flags allow"
    return f"{state} ({isa} variant: {how})"


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
    from zgtool.engine.config import auto_cpu_dtype

    if e.model is None:
        return "none (null backend: no weights)"
    if e.config.dtype != "auto":
        return f"{e.dtype} (--dtype {e.config.dtype})"
    if str(e.device).startswith("cuda"):
        return f"{e.dtype} (auto: CUDA)"
    return f"{e.dtype} ({auto_cpu_dtype()[1]})"


def threads_row(e: Any, requested: int | None) -> str:
    if e.model is None:
        return "none (null backend: no compute, torch not loaded)"
    import torch

    from zgtool.engine.config import SMALL_BOX_CPUS, available_cpus

    how = "--num-threads" if requested else (
        f"default: all CPUs up to {SMALL_BOX_CPUS}" if available_cpus() <= SMALL_BOX_CPUS
        else "default: all CPUs but one, which the I/O loop keeps")
    return f"{torch.get_num_threads()} torch compute thread(s) of {available_cpus()} CPUs ({how})"


def print_startup(built: Any) -> None:
    from rich.console import Console

    console = Console()      # the terminal's width (80 when piped); values fold, keys never wrap
    console.print(startup_table(built))
    console.file.flush()


def startup_table(built: Any) -> Any:
    from rich import box
    from rich.table import Table

    table = Table(title=f"zgtool serve — {built.url}", title_justify="left", show_header=False,
                  box=box.SIMPLE, pad_edge=False)
    table.add_column(style="bold", no_wrap=True)
    table.add_column(overflow="fold")
    for k, v in startup_rows(built):
        table.add_row(k, v)
    return table



"""The C++ llama-server with parallel slots: llama.cpp's batching server, the fair batching peer.

bench/setup_peers.sh --llama-server builds it (only that target) from the llama.cpp vendored in the
llama-cpp-python sdist into <peers>/llama-server/bin/. One slot per concurrent stream
(-np N, -c N * per-slot context), the same thread count as the others, the same GGUF as the
llama-cpp-python peer, and `--poll 0`: its default busy-polling workers starve each other on a
shared 2-core box (SmolLM2 Q4_1, one stream of 48 tokens: 7-350 ms a token with the default,
9-13 ms with --poll 0; llama-cpp-python 12 ms). Requests ask for ignore_eos (equal lengths),
repeat penalty 1.0 (greedy output equal to the others') and usage in the stream.
"""

from __future__ import annotations

from pathlib import Path

from peers_types import SETUP_HINT, GgufFile, ServerSpec, Skip, peers_dir


def install_dir() -> Path:
    return peers_dir() / "llama-server"


def binary() -> Path:
    return install_dir() / "bin" / "llama-server"


def why_missing() -> str | None:
    """None when the binary is built; else the table's skip reason (a failed build says why)."""
    d = install_dir()
    if binary().exists() and (d / ".ok").exists():
        return None
    log = d / "build.log"
    if not log.exists():
        return f"skipped: not built ({SETUP_HINT} --llama-server)"
    lines = [ln.strip() for ln in log.read_text(errors="replace").splitlines() if ln.strip()]
    errors = [ln for ln in lines if "error" in ln.lower()]
    last = (errors or lines or ["empty build log"])[-1][:160]
    return f"skipped: build not finished or failed ({log}): {last}"


def slot_context(max_tokens: int, prompt_tokens: int = 256) -> int:
    """Tokens of context one slot needs: the chat-templated prompt plus the answer, rounded up to 256."""
    need = prompt_tokens + max_tokens
    return -(-need // 256) * 256


def llama_server_spec(row: str, gguf: GgufFile | None, gguf_note: str, port: int, threads: int,
                      slots: int, max_tokens: int, exe: Path | None = None) -> ServerSpec | Skip:
    if exe is None:
        missing = why_missing()
        if missing:
            return Skip(row, missing)
        exe = binary()
    if gguf is None:
        return Skip(row, f"skipped: no GGUF ({gguf_note})")
    slots = max(1, slots)
    argv = (str(exe), "-m", str(gguf.path), "--alias", "m", "--host", "127.0.0.1", "--port", str(port),
            "-np", str(slots), "-c", str(slots * slot_context(max_tokens)),
            "-t", str(threads), "-tb", str(threads), "--poll", "0", "--no-webui")
    return ServerSpec(row, argv, {"OMP_NUM_THREADS": str(threads)}, "/health", "m",
                      {"ignore_eos": True, "repeat_penalty": 1.0}, True, gguf.dtype, usage_in_stream=True)

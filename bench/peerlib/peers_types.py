"""What bench/peers.py talks about: a model case, a server to start, a peer left out, and where
the peers live. Shared by bench/peers.py and its helpers in bench/peerlib/."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SETUP_HINT = "run bench/setup_peers.sh"
BEST = "best"    # the variant suffix of a row in each engine's best dtype ("llama:best")
SAME = "same"    # the row in the run's dtype (--dtype), the engine's plain name ("llama")


def cache_dir() -> Path:
    return Path(os.environ.get("ZGTOOL_CACHE_DIR") or Path.home() / ".cache" / "zgtool")


def peers_dir() -> Path:
    return cache_dir() / "peers"


@dataclass(frozen=True)
class GgufFile:
    dtype: str    # its tensor type as llama.cpp names it: f32, bf16, f16, Q4_1, q8_0
    path: Path
    note: str     # where it came from


@dataclass(frozen=True)
class ModelCase:
    name: str                       # dummy:small | smollm2 | a directory's name
    hf_dir: Path
    gguf_same: GgufFile | None      # the same weights in the run's dtype (llama.cpp's same-dtype row)
    gguf_best: GgufFile | None      # llama.cpp's best dtype of those weights (its best row)
    gguf_note: str = ""             # why one of them is missing
    eos_ids: tuple[int, ...] = ()


@dataclass(frozen=True)
class ServerSpec:
    name: str                      # the row: engine, plus ":best" for the best-dtype variant
    argv: tuple[str, ...]
    env: dict[str, str]
    ready_path: str
    model_field: str               # the "model" value requests carry
    extra_body: dict[str, Any]     # ignore_eos/min_tokens/repeat_penalty where taken
    equal_length_by_flag: bool     # False: screened prompts keep output lengths equal
    dtype: str
    usage_in_stream: bool = False  # asks for stream_options.include_usage (the server honours it)


@dataclass(frozen=True)
class Skip:
    name: str
    reason: str


def row_name(engine: str, variant: str) -> str:
    return engine if variant == SAME else f"{engine}:{BEST}"


def engine_of(row: str) -> str:
    return row.split(":", 1)[0]

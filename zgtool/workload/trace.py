"""Mooncake trace replay: JSONL rows {"timestamp": MS, "input_length": N, "output_length": N, "hash_ids": [...]}.

Field names as in Mooncake's FAST'25 traces (and AIPerf's / Dynamo's readers of them): "timestamp" is the
arrival in ms since the trace began; "timestamp_ms" is read as the same field. Each hash id names one block
of BLOCK_SIZE (512) prompt tokens; two requests sharing leading hash ids share that prefix. A block's text
is filler words seeded by its hash id alone (textgen: one word ~ one token), so a repeated hash id is an
identical block of text and a prefix cache sees the trace's real reuse. The last block is cut to make the
prompt input_length words; a prompt longer than its blocks is padded with words unique to its row.
Send offsets are (timestamp - first timestamp) / 1000 / speedup seconds.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from zgtool.errors import UsageError
from zgtool.workload import textgen
from zgtool.workload.model import RequestSpec, Workload, bad_row
from zgtool.workload.rows import read_rows

BLOCK_SIZE = 512
TIMESTAMP_KEYS = ("timestamp", "timestamp_ms")


def block_words(hash_id: int, block_size: int) -> list[str]:
    return textgen.words(block_size, f"mooncake-block-{hash_id}")


def prompt_for(input_length: int, hash_ids: list[int], block_size: int, row_seed: str) -> str:
    out: list[str] = []
    for h in hash_ids:
        if len(out) >= input_length:
            break
        out.extend(block_words(h, block_size))
    if len(out) < input_length:
        out.extend(textgen.words(input_length - len(out), f"mooncake-tail-{row_seed}"))
    return " ".join(out[:input_length])


def _whole(path: str, line: int, row: dict[str, Any], key: str, minimum: int) -> int:
    v = row.get(key)
    if isinstance(v, bool) or not isinstance(v, int | float) or v != int(v):
        raise bad_row(path, line, f"{key} must be a whole number, not {v!r}")
    if v < minimum:
        raise bad_row(path, line, f"{key} must be at least {minimum}, not {int(v)}"
                      + (" (a negative length)" if v < 0 else ""))
    return int(v)


def load(path: Path, *, speedup: float = 1.0, block_size: int = BLOCK_SIZE,
         rows: list[tuple[int, Any]] | None = None) -> Workload:
    if not speedup > 0:
        raise UsageError(f"--speedup must be positive, not {speedup}")
    if block_size < 1:
        raise UsageError(f"--dataset trace: block must be at least 1, not {block_size}")
    rows = rows if rows is not None else read_rows(path)
    p = str(path)
    specs: list[RequestSpec] = []
    stamps_ms: list[float] = []
    prev: tuple[int, float] | None = None
    for line, row in rows:
        key = next((k for k in TIMESTAMP_KEYS if k in row), None)
        if key is None:
            raise bad_row(p, line, "no timestamp (Mooncake rows: {\"timestamp\": MS, \"input_length\": N, "
                          "\"output_length\": N, \"hash_ids\": [...]})")
        ts = row[key]
        if isinstance(ts, bool) or not isinstance(ts, int | float) or ts < 0:
            raise bad_row(p, line, f"{key} must be a number of ms >= 0, not {ts!r}")
        if prev is not None and ts < prev[1]:
            raise bad_row(p, line, f"timestamps out of order: {ts} ms comes after {prev[1]} ms (line {prev[0]})")
        prev = (line, float(ts))
        n_in = _whole(p, line, row, "input_length", 1)
        n_out = _whole(p, line, row, "output_length", 1)
        hashes = row.get("hash_ids", [])
        if not isinstance(hashes, list) or not all(isinstance(h, int) and not isinstance(h, bool)
                                                   for h in hashes):
            raise bad_row(p, line, "hash_ids must be a list of whole numbers")
        specs.append(RequestSpec((("user", prompt_for(n_in, hashes, block_size, f"{line}")),), n_out))
        stamps_ms.append(float(ts))
    t0 = stamps_ms[0]
    offsets = tuple((t - t0) / 1000.0 / speedup for t in stamps_ms)
    note = f"replayed at its timestamps x{speedup:g} speed-up, {block_size}-token blocks per hash id"
    return Workload("trace", path.name, tuple(specs), offsets_s=offsets, notes=(note,))

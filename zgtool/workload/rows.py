"""Read a JSON array or JSON Lines file into (line number, object) rows; malformed input is a one-line
UsageError naming the file and line."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from zgtool.errors import UsageError
from zgtool.workload.model import bad_row


def read_text(path: Path) -> str:
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise UsageError(f"--dataset {path}: no such file") from None
    except OSError as exc:
        raise UsageError(f"--dataset {path}: cannot read it: {exc.strerror or exc}") from None
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = data[:exc.start].count(b"\n") + 1
        raise bad_row(str(path), line, "not UTF-8 text") from None
    if not text.strip():
        raise bad_row(str(path), 1, "the file is empty")
    return text


def _line_of(text: str, pos: int) -> int:
    return text.count("\n", 0, pos) + 1


def _json_array(path: Path, text: str) -> list[tuple[int, Any]]:
    """Each element of a top-level JSON array with the line it starts on."""
    dec = json.JSONDecoder()
    rows: list[tuple[int, Any]] = []
    i = text.index("[") + 1
    n = len(text)

    def skip_ws(j: int) -> int:
        while j < n and text[j] in " \t\r\n":
            j += 1
        return j

    i = skip_ws(i)
    if i < n and text[i] == "]":
        return rows
    line, pos = 1, 0
    while True:
        i = skip_ws(i)
        try:
            obj, end = dec.raw_decode(text, i)
        except json.JSONDecodeError as exc:
            raise bad_row(str(path), exc.lineno, f"bad JSON: {exc.msg}") from None
        line += text.count("\n", pos, i)         # counted on from the last row: linear in the file
        pos = i
        rows.append((line, obj))
        i = skip_ws(end)
        if i < n and text[i] == ",":
            i += 1
            continue
        if i < n and text[i] == "]":
            if text[skip_ws(i + 1):].strip():
                raise bad_row(str(path), _line_of(text, i + 1), "bad JSON: extra data after the array")
            return rows
        raise bad_row(str(path), _line_of(text, min(i, n - 1)), "bad JSON: expected ',' or ']' in the array")


def read_rows(path: Path) -> list[tuple[int, Any]]:
    """(line, object) for every row: a JSON array's elements, or one object per non-blank line (JSONL)."""
    text = read_text(path)
    if text.lstrip().startswith("["):
        rows = _json_array(path, text)
    else:
        rows = []
        for lineno, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                rows.append((lineno, json.loads(line)))
            except json.JSONDecodeError as exc:
                raise bad_row(str(path), lineno, f"bad JSON: {exc.msg} (column {exc.colno})") from None
    if not rows:
        raise bad_row(str(path), 1, "no rows in the file")
    for lineno, row in rows:
        if not isinstance(row, dict):
            raise bad_row(str(path), lineno, f"a row must be a JSON object, not {type(row).__name__}")
    return rows

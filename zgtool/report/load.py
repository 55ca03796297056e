"""Collect result files for a report: files and folders (every *.json result in them, not recursive
into run/ or k6/ working folders), grouped by kind in a stable order."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from zgtool.errors import UsageError
from zgtool.results import SCHEMA, load_result


@dataclass
class ResultSet:
    """Every loaded result, with the file it came from, plus the files that were not results."""

    results: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    ignored: list[str] = field(default_factory=list)

    def of(self, *kinds: str) -> list[dict[str, Any]]:
        return [r for _, r in self.results if r.get("kind") in kinds]

    def labelled(self, *kinds: str) -> list[tuple[str, dict[str, Any]]]:
        return [(p, r) for p, r in self.results if r.get("kind") in kinds]

    def first(self, kind: str) -> dict[str, Any] | None:
        found = self.of(kind)
        return found[0] if found else None

    @property
    def kinds(self) -> list[str]:
        return sorted({str(r.get("kind")) for _, r in self.results})


def _is_result(path: Path) -> bool:
    try:
        obj = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return False
    return isinstance(obj, dict) and obj.get("schema") == SCHEMA


def collect(paths: list[Path]) -> ResultSet:
    """Files are loaded strictly (a named file that is not a result is an error); a folder
    contributes the results it holds and lists the other JSON files as ignored."""
    if not paths:
        raise UsageError("give result files or a folder of them (e.g. reports/<timestamp>/)")
    rs = ResultSet()
    for p in paths:
        if p.is_dir():
            found = sorted(p.glob("*.json"))
            results = [f for f in found if _is_result(f)]
            rs.ignored.extend(str(f) for f in found if f not in results)
            rs.results.extend((str(f), load_result(f)) for f in results)
        elif p.exists():
            rs.results.append((str(p), load_result(p)))
        else:
            raise UsageError(f"no such file or folder: {p}")
    if not rs.results:
        raise UsageError(f"no zgtool result files (schema {SCHEMA!r}) in {', '.join(map(str, paths))}")
    return rs

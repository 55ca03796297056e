"""docs/architecture.md names the request path and the measurement path as lists of files, one line
each; every file it names exists, and each list is there and not empty (issue 34)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "architecture.md"
PATH = re.compile(r"`((?:zgtool|engine|probes|k6|tests|bench|scripts|docs)/[\w./-]+)`")


def _section(title: str) -> list[str]:
    text = DOC.read_text(encoding="utf-8")
    start = text.index(f"## {title}")
    end = text.find("\n## ", start + 1)
    return [ln for ln in text[start:end if end > 0 else None].splitlines() if ln.startswith("- `")]


def test_every_file_the_map_names_exists() -> None:
    named = set(PATH.findall(DOC.read_text(encoding="utf-8"))) | set(
        re.findall(r"\b((?:tests|docs)/[\w/]+\.(?:py|md))\b", DOC.read_text(encoding="utf-8")))
    assert len(named) > 40
    missing = sorted(p for p in named if not (ROOT / p).exists())
    assert not missing, f"docs/architecture.md names files that do not exist: {missing}"


def test_both_paths_are_lists_of_files_one_line_each() -> None:
    for title in ("The request path", "The measurement path"):
        lines = _section(title)
        assert len(lines) >= 15, title
        for ln in lines:
            assert PATH.match(ln[2:]), f"{title}: a line that does not start with a file: {ln}"
            assert " — " in ln and ln.split(" — ", 1)[1].strip(), f"{title}: a file without its line: {ln}"

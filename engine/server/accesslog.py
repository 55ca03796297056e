"""--access-log FILE: one JSON line per request with its timings (never the API key)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, TextIO


class AccessLog:
    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # Line-buffered: each record reaches the file when written, so `tail -f` and a
        # crash both see whole lines.
        self._fh: TextIO | None = self.path.open("a", buffering=1, encoding="utf-8")

    def write(self, record: dict[str, Any]) -> None:
        if self._fh is None:
            return
        record.setdefault("ts", round(time.time(), 6))
        self._fh.write(json.dumps(record, separators=(",", ":")) + "\n")

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None

"""Test-wide set-up. With --import-mode=importlib, helper modules that live next to the
tests (e.g. tests/dcgm/dcgm_helpers.py) are made importable by name here."""

from __future__ import annotations

import sys
from pathlib import Path

_HERE = Path(__file__).parent
for _d in sorted(p for p in _HERE.rglob("*") if p.is_dir() and p.name not in ("__pycache__", "data")):
    if str(_d) not in sys.path:
        sys.path.insert(0, str(_d))

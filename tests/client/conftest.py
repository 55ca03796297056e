"""Fixtures for client tests: a real scripted HTTP server per test (stopped afterwards)."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

# The helper module sits next to this file; pytest's importlib mode does not put it on sys.path.
sys.path.insert(0, str(Path(__file__).parent))
from scripted_llm_server import ScriptedServer  # noqa: E402


@pytest.fixture
def scripted() -> Iterator[ScriptedServer]:
    server = ScriptedServer()
    try:
        yield server
    finally:
        server.close()

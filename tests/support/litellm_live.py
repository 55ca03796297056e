"""The real LiteLLM proxy (its own venv) in front of zgtool's engine on dummy:tiny, both started here:
what the LiteLLM tests share (tests/gateway/test_litellm_detection.py, tests/latency/test_litellm_stream_live.py).
tests/conftest.py puts this folder on sys.path."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from zgtool.errors import MissingCapability
from zgtool.gateway.kinds import Gateway, start_gateway
from zgtool.gateway.supervisor import LocalStack, StackConfig

LITELLM_TIMEOUT_S = 900      # the LiteLLM venv may need creating first (minutes)


@contextmanager
def tiny_engine() -> Iterator[str]:
    """zgtool's engine on dummy:tiny, alone; its URL."""
    with LocalStack(StackConfig(model="dummy:tiny", paths=())) as st:
        yield st.urls["direct"]


@contextmanager
def litellm_in_front(engine: str, workdir: Path, model: str) -> Iterator[Gateway]:
    """LiteLLM in front of ``engine`` (zgtool's generated config for ``model``); a test fails, not
    skips, when its venv cannot be created."""
    from zgtool.gateway.litellm import ensure_venv

    try:
        ensure_venv()
    except MissingCapability as exc:
        pytest.fail(f"the LiteLLM venv could not be created: {exc.message}")
    with start_gateway("litellm", engine, workdir, model=model) as gw:
        yield gw

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


@contextmanager
def front(kind: str, engine: str, workdir: Path, request: pytest.FixtureRequest) -> Iterator[str]:
    """The URL of a gateway of ``kind`` in front of ``engine``, for a test parametrized over the kinds:
    LiteLLM is the session's one (``litellm_before_null``, tests/conftest.py: importing its proxy takes
    ~12 s of CPU, so it starts once), so ``engine`` must be the session's ``null_engine``; every other
    kind starts here, in ``workdir``, and stops when the block ends."""
    if kind == "litellm":
        shared: Gateway = request.getfixturevalue("litellm_before_null")
        assert engine == request.getfixturevalue("null_engine"), "the shared LiteLLM fronts the session's null engine"
        yield shared.url
        return
    with start_gateway(kind, engine, workdir, model="null") as gw:
        yield gw.url

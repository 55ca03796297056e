"""The stack that failed outright (issue 39 item 7): zgtool's generated LiteLLM config lists "null" and "*",
LiteLLM's /v1/models then lists "null" first and some 220 OpenAI ids, and the engine behind serves none of
them. Detection must not measure "null": in a run with the engine first, LiteLLM measures the engine's model
(through its wildcard); alone, it measures the model the engine LiteLLM publishes behind it (GET /model/info) serves;
and the engine is named through LiteLLM from its forwarded Server header. The real
LiteLLM proxy (its own venv) in front of zgtool's engine (dummy:tiny), both started here."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from litellm_live import LITELLM_TIMEOUT_S, litellm_in_front, tiny_engine

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
    # the engine answers both APIs with its timing, LiteLLM passes it on only from chat/completions: both paths
    # are measured there, so that they send the same request (the direct path alone would take Anthropic's)
    assert direct["api"] == via["api"] == "openai"
    assert "so that every path sends the same request" in direct["detected"]["how"]


@pytest.mark.timeout(LITELLM_TIMEOUT_S)
def test_litellm_alone_measures_the_model_the_engine_behind_it_serves(litellm: Gateway, engine: str) -> None:
    # LiteLLM lists "null" and some 220 OpenAI ids its wildcard answers to, none of them the engine's; it publishes
    # the engine behind (GET /model/info: every wildcard row names the one deployment), whose own listing is asked
    # and measured first. (A gateway that publishes nothing: the engine's refusal names what it serves,
    # tests/latency/test_detect_models.py.)
    r = _zg("latency-split", litellm.url, *FAST, "--json")
    assert r.returncode == 0, r.stderr
    (via,) = json.loads(r.stdout)["data"]["targets"]
    assert via["detected"]["model"] == "dummy:tiny" and via["num_ok"] == 3
    how = via["detected"]["how"]
    assert f"the engine behind it, {engine} (GET /model/info" in how and "serves 'dummy:tiny'" in how
    assert "skipped" not in how                       # no listed id was tried before the engine's own

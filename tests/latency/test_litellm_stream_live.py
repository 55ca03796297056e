"""A stream through the real LiteLLM proxy, measured by latency-split as a new user would run it (issue 38):
every stream figure kept (the packet clock where this process may open one), LiteLLM's own overhead header read
as its hop report, and the tax on the first token given with an interval. Behind the `peers` marker
(ZGTOOL_PEER_TESTS=1): it starts LiteLLM (its own venv) in front of zgtool's engine (dummy:tiny)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from litellm_live import LITELLM_TIMEOUT_S, litellm_in_front, tiny_engine

from zgtool.gateway.kinds import Gateway

pytestmark = pytest.mark.peers


@pytest.fixture(scope="module")
def engine() -> Iterator[str]:
    with tiny_engine() as url:
        yield url


@pytest.fixture(scope="module")
def litellm(engine: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    with litellm_in_front(engine, tmp_path_factory.mktemp("litellm"), "dummy:tiny") as gw:
        yield gw


@pytest.mark.timeout(LITELLM_TIMEOUT_S)
def test_a_stream_through_litellm_keeps_every_figure_and_gets_its_first_token_tax(
        engine: str, litellm: Gateway) -> None:
    r = subprocess.run([sys.executable, "-m", "zgtool", "latency-split", engine, litellm.url, "--stream",
                        "-n", "16", "--max-tokens", "4", "--warmup", "1", "--json"],
                       capture_output=True, text=True, timeout=600, cwd=Path.cwd())
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)["data"]
    direct, via = data["targets"]
    assert direct["num_ok"] == via["num_ok"] == 16
    ok = [s for s in via["samples"] if s["ok"]]
    assert [s["unvouched"] for s in ok if s["unvouched"]] == [], "a stream figure was left out"
    if os.geteuid() == 0:
        assert {s["rx_clock"] for s in ok} == {"packet"}
    assert all("x-litellm-overhead-duration-ms" in s["hop_reports"] for s in ok)
    ttft = next(d for d in data["differences"] if d["phase"] == "ttft_ms")
    assert ttft["diff_ms"] is not None and ttft["lo_ms"] is not None and ttft["hi_ms"] is not None

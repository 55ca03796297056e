"""The client against the live engine (`zgtool serve --model null`), started for real on a free port."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from scripted_llm_server import free_port
from skip_clock import SkipClock

from zgtool.client import AutoFallbackPolicy, Client, FallbackConfig, RequestFailed, RetryConfig
from zgtool.targets import Target

KEYS = """
[tiers.open]
max_concurrent = 0

[tiers.tight]
requests_per_min = 1

[[keys]]
name = "open"
tier = "open"
key = "sk-client-open"

[[keys]]
name = "tight"
tier = "tight"
key = "sk-client-tight"
"""


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    tmp = tmp_path_factory.mktemp("engine")
    (tmp / "keys.toml").write_text(KEYS)
    port = free_port()
    log = (tmp / "serve.log").open("w")
    proc = subprocess.Popen([sys.executable, "-m", "zgtool", "serve", "--model",
                             "null", "--host", "127.0.0.1", "--port", str(port), "--keys", str(tmp / "keys.toml")],
                            stdout=log, stderr=subprocess.STDOUT, cwd=tmp)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 90
        while True:
            if proc.poll() is not None:
                pytest.fail(f"engine server could not start (exit {proc.returncode}): "
                            f"{(tmp / 'serve.log').read_text()[-500:]}")
            try:
                if httpx.get(url + "/health", timeout=1.0).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                pytest.fail("engine server did not answer /health within 90 s")
            time.sleep(0.2)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


@pytest.fixture
def keys(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ZG_CLIENT_OPEN_KEY", "sk-client-open")
    monkeypatch.setenv("ZG_CLIENT_TIGHT_KEY", "sk-client-tight")


def target(url: str, api: str = "anthropic", key_env: str = "ZG_CLIENT_OPEN_KEY") -> Target:
    return Target("engine", url, api, "default", key_env)


def test_engine_answer_carries_a_typed_load_hint_and_ids(engine: str, keys: None) -> None:
    with Client(target(engine)) as c:
        res = c.ask("hello", max_tokens=8)
    assert res.ok and res.text and len(res.attempts) == 1 and res.served_model == "default"
    assert res.request_id and res.request_id.startswith("req_")
    hint = res.load_hint
    assert hint is not None and 0.0 <= hint.kv_util <= 1.0 and hint.running >= 0 and hint.waiting >= 0
    assert hint.util_pct is not None and "cap_factor" in hint.extra


def test_engine_stream_matches_the_non_stream_answer(engine: str, keys: None) -> None:
    shown: list[str] = []
    with Client(target(engine)) as c:
        whole = c.ask("hello", max_tokens=12)
        streamed = c.ask("hello", max_tokens=12, stream=True, on_text=shown.append)
    assert streamed.ok and streamed.text == whole.text == "".join(shown)
    assert streamed.stop_reason == whole.stop_reason == "max_tokens" and streamed.load_hint is not None


def test_engine_openai_api_works_through_the_openai_sdk(engine: str, keys: None) -> None:
    with Client(target(engine, "openai")) as c:
        res = c.ask("hello", max_tokens=8)
        streamed = c.ask("hello", max_tokens=8, stream=True)
    assert res.ok and streamed.ok and res.text == streamed.text and res.load_hint is not None


def test_engine_unknown_model_404_is_not_retried(engine: str, keys: None) -> None:
    with Client(target(engine)) as c, pytest.raises(RequestFailed) as info:
        c.ask("hello", model="no-such-model")
    (attempt,) = info.value.result.attempts
    assert attempt.status == 404 and attempt.error_type == "not_found_error" and not attempt.retried


def test_engine_rate_limit_429_retry_after_is_read_and_a_too_long_wait_is_refused(engine: str, keys: None) -> None:
    with Client(target(engine, key_env="ZG_CLIENT_TIGHT_KEY"), retry=RetryConfig(max_wait_s=5)) as c:
        assert c.ask("hello", max_tokens=4).ok
        with pytest.raises(RequestFailed) as info:
            c.ask("hello", max_tokens=4)
    result = info.value.result
    (attempt,) = result.attempts
    assert attempt.status == 429 and attempt.error_type == "rate_limit_error"
    assert "server asked to wait" in attempt.reason and result.rate_limits.retry_after_s > 5
    assert result.rate_limits.buckets["requests"].limit == 1
    assert result.rate_limits.buckets["requests"].remaining == 0


def test_engine_timeouts_move_a_shared_policy_to_the_fallback_model_and_back(engine: str, keys: None) -> None:
    # Timeouts alone trigger here (no threshold): a null engine cannot be driven to 95% honestly;
    # the load-threshold path is covered against the scripted server.
    clock = SkipClock()
    policy = AutoFallbackPolicy(FallbackConfig(("default", "null"), util_threshold_pct=None, cooldown_s=30,
                                               recover_successes=2), clock=clock)
    impatient = Client(target(engine), policy=policy, timeout_s=0.005,
                       retry=RetryConfig(max_attempts=3, base_delay_s=0.001))
    patient = Client(target(engine), policy=policy, timeout_s=30)
    with impatient, patient:
        with pytest.raises(RequestFailed):
            impatient.ask("hello", max_tokens=3000)
        assert policy.model == "null" and policy.switches[0].direction == "fallback"
        on_fallback = patient.ask("hello", max_tokens=4)
        assert on_fallback.served_model == "null" and on_fallback.model == "null"
        patient.ask("hello", max_tokens=4)
        clock.skip(31)       # the cool-down passes
        back = patient.ask("hello", max_tokens=4)
    assert back.model == "default" and back.served_model == "default"
    assert [s.direction for s in policy.switches] == ["fallback", "recover"]


def test_engine_ask_cli_runs_against_the_live_engine(engine: str, keys: None, tmp_path: Path) -> None:
    env = {**os.environ, "COLUMNS": "200"}
    cfg = tmp_path / "zgtool.toml"
    cfg.write_text(f'[targets.eng]\nurl = "{engine}"\nkey_env = "ZG_CLIENT_OPEN_KEY"\n')
    proc = subprocess.run([sys.executable, "-m", "zgtool", "client", "ask", "eng",
                           "hello", "--stream", "--fallback", "null", "--max-tokens", "8"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "model: default" in proc.stdout and "load hint: kv_util=" in proc.stdout

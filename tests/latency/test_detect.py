"""Pointed at an OpenAI-only server with no --api/--model, latency-split finds the API and the served model,
says so, and keeps the server's own error text when requests fail (a real local OpenAI-only server)."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from replay_servers import running
from zgtest import run_zgtool as zg

from zgtool.errors import ExitCode
from zgtool.latency.wire.detect import detect
from zgtool.targets import resolve

FAST = ["-n", "3", "--max-tokens", "4", "--warmup", "0", "--rounds", "1"]


@pytest.fixture(scope="module")
def openai_only() -> Iterator[str]:
    with running("openai-only", "tiny-openai") as url:
        yield url


def test_an_openai_only_server_is_detected_with_its_model(openai_only: str) -> None:
    t, found = detect(resolve(openai_only), api_known=False, model_known=False)
    assert found is not None and (t.api, t.model) == ("openai", "tiny-openai")
    assert "GET /v1/models lists 'tiny-openai'" in found.how
    assert "/v1/messages -> 404" in found.how


def test_a_base_url_ending_in_v1_is_detected_too(openai_only: str) -> None:
    t, _ = detect(resolve(openai_only + "/v1"), api_known=False, model_known=False)
    assert (t.api, t.model) == ("openai", "tiny-openai")


def test_a_given_api_and_model_are_not_probed(openai_only: str) -> None:
    t = resolve(openai_only, api="anthropic", model="x")
    assert detect(t, api_known=True, model_known=True) == (t, None)


def test_latency_split_just_works_against_an_openai_only_server(openai_only: str) -> None:
    r = zg("latency-split", openai_only, *FAST)
    assert r.returncode == 0, r.stderr
    assert "detected the openai API, model 'tiny-openai'" in r.stderr
    r = zg("latency-split", openai_only, *FAST, "--json")
    assert r.returncode == 0, r.stderr
    target = json.loads(r.stdout)["data"]["targets"][0]
    assert target["api"] == "openai" and target["num_ok"] == 3
    assert target["detected"]["model"] == "tiny-openai"
    assert all(len(s["trace_id"]) == 32 for s in target["samples"])


def test_when_every_request_fails_the_servers_words_are_kept_and_the_exit_is_5(openai_only: str) -> None:
    r = zg("latency-split", openai_only, *FAST, "--api", "openai", "--model", "nope", "--json")
    assert r.returncode == ExitCode.UNRELIABLE      # nothing was measured: never a verdict
    assert "all 3 requests failed (http_404:NotFoundError x3)" in r.stderr
    assert "The model `nope` does not exist." in r.stderr and r.stderr.count("\n") == 1
    samples = json.loads(r.stdout)["data"]["targets"][0]["samples"]
    assert {s["error_detail"] for s in samples} == {"The model `nope` does not exist."}


def test_a_server_speaking_both_apis_keeps_zgtools_anthropic_default(origin: str) -> None:
    t, found = detect(resolve(origin), api_known=False, model_known=True)
    assert found is not None and t.api == "anthropic"


def test_when_both_apis_answer_the_one_where_the_engine_reports_its_timing_wins() -> None:
    import httpx

    from zgtool.latency.wire.detect import _choose

    msg = httpx.Response(200, json={"type": "message", "content": []})
    vllm_chat = httpx.Response(200, json={"choices": [], "metrics": {
        "queue_time_ms": 0.03, "time_to_first_token_ms": 140.0, "generation_time_ms": 1400.0}})
    assert _choose(msg, vllm_chat, "anthropic") == "openai"          # vLLM 0.32 answers both (seen here)
    timed = {"server-timing": "queue;dur=0.1, total;dur=5"}
    zg_msg = httpx.Response(200, headers=timed, json={"type": "message"})
    zg_chat = httpx.Response(200, headers=timed, json={"choices": []})
    assert _choose(zg_msg, zg_chat, "anthropic") == "anthropic"
    assert _choose(httpx.Response(404), httpx.Response(400), "anthropic") == "openai"   # a route that exists
    assert _choose(httpx.Response(529), httpx.Response(529), "anthropic") == "anthropic"

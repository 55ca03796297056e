"""The in-pipeline safety filter on a real answer: SmolLM2 (the default model) answers
"The capital of France is Paris."; a policy that denies "Paris" cuts it, stream and non-stream."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

pytestmark = pytest.mark.slow

QUESTION = "What is the capital of France?"


@pytest.fixture(scope="module")
def guarded(start_server: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from zgtool.engine.gguf_convert import ensure_converted

    ensure_converted("smollm2")
    policy = tmp_path_factory.mktemp("policy") / "policy.toml"
    policy.write_text('message = "blocked by the France policy"\n[output]\ndeny_phrases = ["Paris"]\n')
    with start_server(model="smollm2", dtype="float32", safety_policy=Path(policy), kv_memory_mb=32,
                      max_num_seqs=4) as s:
        yield s


def _body(text: str, **kw: Any) -> dict[str, Any]:
    return {"model": "smollm2", "max_tokens": 24, "temperature": 0,
            "messages": [{"role": "user", "content": text}], **kw}


def test_a_real_answer_with_a_denied_phrase_is_cut(guarded: Any) -> None:
    r = httpx.post(guarded.url + "/v1/chat/completions", json=_body(QUESTION), timeout=120)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["code"] == "content_policy_violation" and "France policy" in err["message"], err   # OpenAI shape
    assert "Paris" not in r.text
    assert guarded.wait_idle(30)["kv_blocks_used"] == 0


def test_a_streamed_real_answer_stops_before_the_denied_phrase(guarded: Any) -> None:
    r = httpx.post(guarded.url + "/v1/chat/completions", json=_body(QUESTION, stream=True), timeout=120)
    assert r.status_code == 200
    events = [b for b in r.text.split("\n\n") if b.startswith("data: ")]
    text = "".join(json.loads(e[6:])["choices"][0]["delta"].get("content") or ""
                   for e in events if '"choices"' in e)
    assert "capital of France" in text and "Paris" not in text       # the answer up to the phrase, not beyond
    assert '"content_policy_violation"' in r.text

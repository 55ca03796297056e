"""A body over intake.PROCESS_BODY_BYTES is decoded, parsed and checked against the context in the
body worker process, so the server's GIL is never held for a whole decode (issue 37 item 4). The
worker's verdict must be the in-process one exactly (status, message, param, the parsed request),
an unknown model must still be named before the context, and the worker must never outlive its
server or lose a request when it dies."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from typing import Any

import httpx
import pytest

from zgtool.engine.api import anthropic as anth
from zgtool.engine.api import openai as oai
from zgtool.engine.errors import ModelNotFound
from zgtool.engine.server import body_worker, intake

BIG = intake.PROCESS_BODY_BYTES + 1000


def _body(content: str = "x" * BIG, **fields: Any) -> bytes:
    return json.dumps({"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": content}],
                       **fields}).encode()


def _outcome(fn: Any, *args: Any) -> Any:
    try:
        req = fn(*args)
    except Exception as exc:  # noqa: BLE001 - the outcomes are compared, whatever they are
        return ("error", type(exc), exc.args, exc.__dict__)
    return ("ok", dataclasses.asdict(req))


def _in_process(parse: Any, body: bytes, max_model_len: int, max_token_chars: int | None) -> Any:
    req = intake._decode_large(parse, body, max_model_len)
    intake.check_fits(req, max_token_chars, max_model_len)
    return req


def _fail_in_parent(*_: Any) -> Any:
    raise AssertionError("decoded in the server's process")


CASES = {
    "fits": (anth.parse_messages, _body(), 4_000_000, 1),
    "cannot fit": (anth.parse_messages, _body(), 8192, 1),
    "cannot fit, openai": (oai.parse_chat, _body(), 8192, 1),
    "no bound from the tokenizer": (anth.parse_messages, _body(), 8192, None),
    "a bad parameter": (anth.parse_messages, _body(max_tokens="four"), 8192, 1),
    "an unknown parameter, openai": (oai.parse_chat, _body(n=3), 8192, 1),
    "too many messages": (anth.parse_messages, _body() + b" " + b'"role"' * 9000, 8192, 1),
    "truncated": (anth.parse_messages, _body()[:-1], 8192, 1),
    "not UTF-8": (anth.parse_messages, _body("\u00e9" * (BIG // 2)).replace(b"\\u00e9", b"\xff", 1), 8192, 1),
    "a lone surrogate": (anth.parse_messages, _body("\ud800" + "x" * BIG), 8192, 1),
    "not an object": (anth.parse_messages, json.dumps(["x" * BIG]).encode(), 8192, 1),
    "nested too deeply": (anth.parse_messages, _body()[:-1] + b', "pad": ' + b"[" * 5000 + b"]" * 5000 + b"}", 8192, 1),
}


@pytest.mark.parametrize("case", CASES)
def test_the_worker_gives_the_in_process_verdict(case: str, monkeypatch: pytest.MonkeyPatch) -> None:
    parse, body, max_model_len, per_token = CASES[case]
    assert len(body) > intake.PROCESS_BODY_BYTES
    expected = _outcome(_in_process, parse, body, max_model_len, per_token)
    monkeypatch.setattr(intake, "load_json_object", _fail_in_parent)
    monkeypatch.setattr(intake, "decode_yielding", _fail_in_parent)
    got = _outcome(intake._decode_large_anywhere, parse, body, max_model_len, per_token, None)
    assert got == expected
    assert body_worker.worker_pid() is not None


def test_an_unknown_model_is_named_before_the_context() -> None:
    named: list[str] = []

    def check_model(model: str) -> None:
        named.append(model)
        raise ModelNotFound(f"model {model!r} is not served here")

    with pytest.raises(ModelNotFound, match="'m' is not served"):
        intake._decode_large_anywhere(anth.parse_messages, _body(), 8192, 1, check_model)
    assert named == ["m"]


def _wait_gone(pid: int, timeout_s: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.05)
    return False


def test_a_killed_worker_is_replaced_and_the_request_still_answered() -> None:
    args = (anth.parse_messages, _body(), 8192, 1)
    first = _outcome(intake._decode_large_anywhere, *args, None)
    pid = body_worker.worker_pid()
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    # answered all the same (by a fresh worker, or here if the dead one was met mid-call)
    assert _outcome(intake._decode_large_anywhere, *args, None) == first
    assert _outcome(intake._decode_large_anywhere, *args, None) == first
    assert body_worker.worker_pid() not in (None, pid)
    assert _wait_gone(pid)


WORKER_USER = """
import json, sys, time
from zgtool.engine.api import anthropic as anth
from zgtool.engine.server import body_worker, intake
body = json.dumps({"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": "x" * %d}]}).encode()
try:
    intake._decode_large_anywhere(anth.parse_messages, body, 8192, 1, None)
except Exception as exc:
    print(type(exc).__name__, body_worker.worker_pid(), flush=True)
time.sleep(120)
"""


def test_the_worker_exits_when_its_server_is_killed() -> None:
    proc = subprocess.Popen([sys.executable, "-c", WORKER_USER % BIG], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        name, pid = proc.stdout.readline().split()
        assert name == "PromptCannotFit"
    finally:
        proc.kill()
        proc.wait(30)
    assert _wait_gone(int(pid)), "the body worker outlived its server"


@pytest.mark.parametrize("route", ["/v1/messages", "/v1/chat/completions", "/v1/messages/count_tokens"])
def test_a_large_prompt_is_refused_without_decoding_it_in_the_server(server: Any, route: str,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    body = {"model": "null", "messages": [{"role": "user", "content": "x" * BIG}]}
    if route != "/v1/messages/count_tokens":
        body["max_tokens"] = 4
    monkeypatch.setattr(intake, "load_json_object", _fail_in_parent)
    r = httpx.post(server.url + route, json=body, timeout=120)
    assert r.status_code == 400, r.text
    assert f"at least {BIG} tokens" in r.json()["error"]["message"]
    # an unknown model is named first, as for a small body
    r = httpx.post(server.url + route, json={**body, "model": "nope"}, timeout=120)
    assert r.status_code == 404 and "nope" in r.json()["error"]["message"], r.text

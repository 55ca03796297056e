"""Tenancy through every front (issue 37, item 1): behind `serve --gateway stack --keys` the engine
shares its seats per client key exactly as on its own port. pygw forwards with the stack's per-run
key, which the engine's keys file marks ``gateway = true``: the engine believes the client key pygw
names in x-zgtool-tenant from that key alone, never from a client's."""

from __future__ import annotations

import json
import threading
import tomllib
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from zgtest import wait_until

from zgtool.gateway.stack_keys import INTERNAL_TIER, engine_keys_toml
from zgtool.gateway.supervisor import LocalStack, StackConfig
from zgtool.http.errors import ConfigError
from zgtool.http.keys import parse_keys

MODEL = "dummy:small"    # ~44M parameters: a 1,500-token stream holds its seat for many seconds
FREE = "sk-ten-free"
PRO = "sk-ten-pro"
TINY = "sk-ten-tiny"
ADMIN = "sk-ten-admin"
KEYS = f"""
[tiers.free]
max_concurrent = 4
[tiers.pro]
max_concurrent = 64
[tiers.tiny]
requests_per_min = 2
[[keys]]
name = "free"
tier = "free"
key = "{FREE}"
[[keys]]
name = "tiny"
tier = "tiny"
key = "{TINY}"
[[keys]]
name = "pro"
tier = "pro"
key = "{PRO}"
gateway = true
[admin]
keys = ["{ADMIN}"]
"""


def test_only_the_stacks_own_key_is_a_gateway_key_in_the_engines_keys_file(tmp_path: Path) -> None:
    keys = tmp_path / "keys.toml"
    keys.write_text(KEYS)    # a client key claiming gateway = true gets no such power behind the stack
    doc = tomllib.loads(engine_keys_toml(keys, "sk-internal"))
    flags = {k["name"]: k.get("gateway", False) for k in doc["keys"]}
    assert flags == {"free": False, "tiny": False, "pro": False, INTERNAL_TIER: True}


def test_gateway_must_be_true_or_false() -> None:
    doc = tomllib.loads(KEYS.replace("gateway = true", 'gateway = "yes"'))
    with pytest.raises(ConfigError, match="gateway must be true or false"):
        parse_keys(doc, "keys.toml")
    assert [k.gateway for k in parse_keys(tomllib.loads(KEYS), "keys.toml").keys] == [False, False, True]


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalStack]:
    keys = tmp_path_factory.mktemp("keys") / "keys.toml"
    keys.write_text(KEYS)
    cfg = StackConfig(model=MODEL, paths=("stack",), pygw_keys=keys, pygw_policy="none",
                      engine_args=("--max-num-seqs", "4"), run_dir=tmp_path_factory.mktemp("run"))
    with LocalStack(cfg) as st:
        yield st


def _stream(url: str, key: str, max_tokens: int, events: list[tuple[str, str]], tag: str,
            stop: threading.Event) -> None:
    body = {"model": MODEL, "max_tokens": max_tokens, "stream": True, "temperature": 0, "ignore_eos": True,
            "messages": [{"role": "user", "content": f"{tag} says hello"}]}
    # every client names another tenant itself: pygw replaces the header with the key it authenticated
    headers = {"x-api-key": key, "x-zgtool-tenant": "free" if key == PRO else "pro"}
    with httpx.stream("POST", url + "/v1/messages", json=body, headers=headers, timeout=120) as r:
        assert r.status_code == 200, r.read()
        first = True
        for line in r.iter_lines():
            if first and line.startswith("event: content_block_delta"):
                events.append((tag, "first"))
                first = False
            if stop.is_set():
                break       # hanging up aborts it
    events.append((tag, "done"))


def _load(st: LocalStack) -> dict:
    return json.loads(httpx.get(st.urls["direct"] + "/health", timeout=10).headers["x-gpu-load-hint"])


def test_through_the_keyed_stack_a_second_key_is_served_while_the_first_fills_every_seat(stack: LocalStack) -> None:
    events: list[tuple[str, str]] = []
    url = stack.urls["stack"]
    stop = threading.Event()
    pro = [threading.Thread(target=_stream, args=(url, PRO, 1500, events, f"pro{i}", stop)) for i in range(8)]
    for t in pro:
        t.start()
    try:
        # the pro key holds every seat and has more waiting
        wait_until(lambda: (h := _load(stack))["running"] >= 4 and h["waiting"] >= 1, 60,
                   "the pro key to fill every seat")
        free = threading.Thread(target=_stream, args=(url, FREE, 4, events, "free", threading.Event()))
        free.start()
        free.join(120)
    finally:
        stop.set()        # the pro streams hang up once the free one is done (or the test failed)
        for t in pro:
            t.join(120)
    order = [e for e in events if e[1] in ("first", "done")]
    free_first = order.index(("free", "first"))
    pro_done = [i for i, (tag, what) in enumerate(order) if tag.startswith("pro") and what == "done"]
    # one pro stream finishing would have freed a seat: the free key got one while all four were held
    assert len(pro_done) == 8 and free_first < min(pro_done), order


def test_a_tiers_request_rate_holds_on_count_tokens_through_the_stack(stack: LocalStack) -> None:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}
    codes = [httpx.post(stack.urls["stack"] + "/v1/messages/count_tokens", json=body, timeout=30,
                        headers={"x-api-key": TINY}).status_code for _ in range(3)]
    assert codes == [200, 200, 429]

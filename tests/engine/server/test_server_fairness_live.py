"""One key filling every running seat does not starve another (issue 22: a pro key's 32 streams
pushed a free key's TTFT from ~10 ms to 18-20 s): the server passes each API key to the engine
as a tenant and the scheduler shares seats between them."""

from __future__ import annotations

import threading
from typing import Any

import httpx
from zgtest import wait_until


def _stream(url: str, key: str, max_tokens: int, events: list[tuple[str, str]], tag: str,
            extra: dict[str, str] | None = None) -> None:
    # ignore_eos: a pro stream must not end early on EOS (greedy on random weights, batch-dependent)
    body = {"model": "dummy:tiny", "max_tokens": max_tokens, "stream": True, "temperature": 0, "ignore_eos": True,
            "messages": [{"role": "user", "content": f"{tag} says hello"}]}
    headers = {"x-api-key": key, "anthropic-version": "2023-06-01", **(extra or {})}
    with httpx.stream("POST", url + "/v1/messages", json=body, headers=headers, timeout=120) as r:
        first = True
        for line in r.iter_lines():
            if first and line.startswith("event: content_block_delta"):
                events.append((tag, "first"))
                first = False
    events.append((tag, "done"))


def _second_key_served_while_the_first_fills_every_seat(s: Any, pro_key: str, free_key: str,
                                                        pro_extra: dict[str, str] | None = None,
                                                        free_extra: dict[str, str] | None = None) -> None:
    events: list[tuple[str, str]] = []
    pro = [threading.Thread(target=_stream, args=(s.url, pro_key, 900, events, f"pro{i}", pro_extra))
           for i in range(8)]
    for t in pro:
        t.start()
    # the pro key holds every seat and has more waiting
    wait_until(lambda: (st := s.engine.stats())["running"] >= 4 and st["waiting"] >= 1, 60,
               "the pro key to fill every seat")
    free = threading.Thread(target=_stream, args=(s.url, free_key, 4, events, "free", free_extra))
    free.start()
    free.join(120)
    for t in pro:
        t.join(120)
    order = [e for e in events if e[1] in ("first", "done")]
    free_first = order.index(("free", "first"))
    pro_done = [i for i, (tag, what) in enumerate(order) if tag.startswith("pro") and what == "done"]
    assert pro_done and free_first < min(pro_done), order


def test_a_second_key_gets_its_first_token_while_the_first_key_fills_every_seat(start_server: Any, keys_file: Any,
                                                                                api_keys: dict[str, str]):
    with start_server(model="dummy:tiny", keys=keys_file, max_num_seqs=4) as s:
        _second_key_served_while_the_first_fills_every_seat(s, api_keys["pro"], api_keys["free"])


GATEWAY_KEY = "sk-test-gateway"
KEYS_WITH_GATEWAY = f"""
[tiers.pro]
[tiers.gw]
[[keys]]
name = "pro-user"
tier = "pro"
key = "sk-test-pro"
[[keys]]
name = "pygw"
tier = "gw"
key = "{GATEWAY_KEY}"
gateway = true
"""


def test_behind_a_gateway_key_the_client_key_it_names_is_the_tenant(start_server: Any, tmp_path: Any):
    """pygw authenticates its own clients and forwards x-zgtool-tenant with its gateway key
    (keys.toml gateway = true): two client keys behind one gateway key share seats fairly."""
    keys = tmp_path / "keys.toml"
    keys.write_text(KEYS_WITH_GATEWAY)
    with start_server(model="dummy:tiny", keys=keys, max_num_seqs=4) as s:
        _second_key_served_while_the_first_fills_every_seat(
            s, GATEWAY_KEY, GATEWAY_KEY, {"x-zgtool-tenant": "pro-client"}, {"x-zgtool-tenant": "free-client"})


def _tenant_of(s: Any, key: str, tenant_header: str | None) -> Any:
    """The tenant the scheduler was handed for one request with this key (and header)."""
    sched = s.engine.scheduler
    seen: list[Any] = []
    add = sched.add
    sched.add = lambda seq: (seen.append(seq.tenant), add(seq))[1]   # observe, then the real add
    try:
        headers = {"x-api-key": key, **({"x-zgtool-tenant": tenant_header} if tenant_header else {})}
        r = httpx.post(s.url + "/v1/messages", headers=headers, timeout=60,
                       json={"model": "null", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]})
        assert r.status_code == 200, r.text
    finally:
        sched.add = add
    assert len(seen) == 1
    return seen[0]


def test_a_client_naming_a_tenant_itself_gains_nothing(start_server: Any, tmp_path: Any):
    keys = tmp_path / "keys.toml"
    keys.write_text(KEYS_WITH_GATEWAY)
    with start_server(model="null", keys=keys, max_num_seqs=4) as s:
        # a client key: its own key is its tenant, whatever it names
        assert _tenant_of(s, "sk-test-pro", "someone-else") == "pro-user"
        assert _tenant_of(s, "sk-test-pro", None) == "pro-user"
        # the gateway key: the client key it names
        assert _tenant_of(s, GATEWAY_KEY, "alice") == "alice"
    with start_server(model="null", max_num_seqs=4) as s:
        # an open engine has one tenant: naming one gains no seat of its own
        assert _tenant_of(s, "anything", "someone-else") is None

"""One key filling every running seat does not starve another (issue 22: a pro key's 32 streams
pushed a free key's TTFT from ~10 ms to 18-20 s): the server passes each API key to the engine
as a tenant and the scheduler shares seats between them."""

from __future__ import annotations

import threading
from typing import Any

import httpx
from zgtest import wait_until


def _stream(url: str, key: str, max_tokens: int, events: list[tuple[str, str]], tag: str,
            header: str = "x-api-key") -> None:
    body = {"model": "dummy:tiny", "max_tokens": max_tokens, "stream": True, "temperature": 0,
            "messages": [{"role": "user", "content": f"{tag} says hello"}]}
    headers = {header: key, "anthropic-version": "2023-06-01"}
    with httpx.stream("POST", url + "/v1/messages", json=body, headers=headers, timeout=120) as r:
        first = True
        for line in r.iter_lines():
            if first and line.startswith("event: content_block_delta"):
                events.append((tag, "first"))
                first = False
    events.append((tag, "done"))


def _second_key_served_while_the_first_fills_every_seat(s: Any, pro_key: str, free_key: str, header: str) -> None:
    events: list[tuple[str, str]] = []
    pro = [threading.Thread(target=_stream, args=(s.url, pro_key, 400, events, f"pro{i}", header))
           for i in range(8)]
    for t in pro:
        t.start()
    # the pro key holds every seat and has more waiting
    wait_until(lambda: (st := s.engine.stats())["running"] >= 4 and st["waiting"] >= 1, 60,
               "the pro key to fill every seat")
    free = threading.Thread(target=_stream, args=(s.url, free_key, 4, events, "free", header))
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
        _second_key_served_while_the_first_fills_every_seat(s, api_keys["pro"], api_keys["free"], "x-api-key")


def test_behind_a_gateway_the_client_key_it_names_is_the_tenant(start_server: Any):
    """pygw authenticates its own clients and forwards x-zgtool-tenant; an open engine believes it."""
    with start_server(model="dummy:tiny", max_num_seqs=4) as s:
        _second_key_served_while_the_first_fills_every_seat(s, "pro-client", "free-client", "x-zgtool-tenant")

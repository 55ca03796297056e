"""/health says degraded (503) while the engine has work and makes no progress, and the stall is a
metric; a wedged engine never answers ok (issue 22)."""

from __future__ import annotations

import threading

import httpx

from zgtool.engine.server import routes as routes_module


def test_health_is_degraded_while_the_engine_is_stuck_and_ok_once_it_moves(start_server, monkeypatch):
    monkeypatch.setattr(routes_module, "STALLED_AFTER_S", 0.0)
    release = threading.Event()
    entered = threading.Event()
    with start_server(model="dummy:tiny") as s:  # a step thread (null steps on the loop)
        real = s.engine.runner.execute

        def stuck(batch):  # noqa: ANN001, ANN202 - the runner, held until the test lets it go
            entered.set()
            release.wait(30)
            return real(batch)

        s.engine.runner.execute = stuck
        client = httpx.Client(base_url=s.url, timeout=10)
        body = {"model": "dummy:tiny", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}
        done: list[int] = []
        t = threading.Thread(target=lambda: done.append(
            client.post("/v1/messages", json=body, headers={"anthropic-version": "2023-06-01"}).status_code))
        t.start()
        try:
            assert entered.wait(10), "the step never started"
            r = httpx.get(s.url + "/health", timeout=5)
            assert r.status_code == 503 and r.json()["status"] == "degraded" and "no progress" in r.json()["reason"]
            assert s.metric("zg_engine_stalled_seconds") > 0
        finally:
            release.set()
            t.join(30)
        assert done == [200]
        s.engine.runner.execute = real
        assert httpx.get(s.url + "/health", timeout=5).status_code == 200  # idle: ok again

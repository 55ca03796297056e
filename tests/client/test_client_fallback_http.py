"""Automatic model fallback end to end: load hints and timeouts from a real scripted server."""

from __future__ import annotations

import json

from scripted_llm_server import ScriptedServer, Step
from skip_clock import SkipClock

from zgtool.client import AutoFallbackPolicy, Client, FallbackConfig, RetryConfig
from zgtool.targets import Target

HOT = {"x-gpu-load-hint": json.dumps({"kv_util": 0.99, "running": 8, "waiting": 31})}
COOL = {"x-gpu-load-hint": json.dumps({"kv_util": 0.05, "running": 1, "waiting": 0})}


def test_high_load_and_timeouts_fall_back_mid_request_and_recover_after_the_cool_down(
        scripted: ScriptedServer) -> None:
    clock = SkipClock()
    policy = AutoFallbackPolicy(FallbackConfig(("big", "small"), cooldown_s=30, recover_successes=2), clock=clock)
    retry = RetryConfig(max_attempts=5, base_delay_s=0.01, max_delay_s=0.02)
    client = Client(Target("s", scripted.url, "anthropic", "big"), policy=policy, retry=retry, timeout_s=0.25)
    scripted.script(Step(200, HOT), *[Step(delay_s=1.5)] * 3, Step(200, COOL), Step(200, COOL))
    with client:
        first = client.ask("hi")
        assert first.load_hint is not None and first.load_hint.util_pct == 99.0
        second = client.ask("hi")
        assert [a.outcome for a in second.attempts] == ["timeout", "timeout", "timeout", "ok"]
        assert [a.model for a in second.attempts] == ["big", "big", "big", "small"]
        assert second.ok and second.served_model == "small"
        (sw,) = second.switches
        assert sw.direction == "fallback" and "3 consecutive timeouts" in sw.reason
        third = client.ask("hi")  # second healthy answer, but still inside the cool-down
        assert third.model == "small" and third.switches == ()
        clock.skip(31)       # the cool-down passes
        fourth = client.ask("hi")
    assert fourth.model == "big" and fourth.switches[0].direction == "recover"
    assert [s.body["model"] for s in scripted.seen] == ["big"] * 4 + ["small"] * 2 + ["big"]
    assert policy.switch_counts == {("big", "small", "fallback"): 1, ("small", "big", "recover"): 1}


def test_a_pinned_model_bypasses_the_policy(scripted: ScriptedServer) -> None:
    policy = AutoFallbackPolicy(FallbackConfig(("big", "small")))
    with Client(Target("s", scripted.url), policy=policy, retry=RetryConfig(max_attempts=1)) as c:
        res = c.ask("hi", model="pinned")
    assert res.model == "pinned" and scripted.seen[0].body["model"] == "pinned"

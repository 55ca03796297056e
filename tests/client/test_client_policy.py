"""AutoFallbackPolicy: falls back on sustained load + timeouts, recovers after the cool-down, never flaps."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from zgtool.client import AutoFallbackPolicy, FallbackConfig, LoadHint, Observation

HOT = LoadHint(kv_util=0.99, running=8, waiting=20)
COOL = LoadHint(kv_util=0.10, running=1, waiting=0)
WARM = LoadHint(kv_util=0.90, running=6, waiting=2)  # below the trigger, above the recovery level


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def make(models: tuple[str, ...] = ("big", "small"), **kw: float) -> tuple[AutoFallbackPolicy, FakeClock]:
    clock = FakeClock()
    return AutoFallbackPolicy(FallbackConfig(models, **kw), clock=clock), clock


def test_sustained_high_load_plus_three_timeouts_switches_to_the_fallback() -> None:
    p, _ = make()
    p.observe(Observation("big", ok=True, hint=HOT))
    assert p.observe(Observation("big", ok=False, timed_out=True)) is None
    assert p.observe(Observation("big", ok=False, timed_out=True)) is None
    sw = p.observe(Observation("big", ok=False, timed_out=True))
    assert sw is not None and (sw.from_model, sw.to_model, sw.direction) == ("big", "small", "fallback")
    assert "3 consecutive timeouts" in sw.reason and "99.0% > 95%" in sw.reason
    assert p.choose() == "small"
    assert p.switch_counts[("big", "small", "fallback")] == 1


def test_timeouts_without_high_load_do_not_switch() -> None:
    p, _ = make()
    p.observe(Observation("big", ok=True, hint=WARM))
    for _ in range(10):
        p.observe(Observation("big", ok=False, timed_out=True))
    assert p.choose() == "big" and not p.switches


def test_a_stale_hint_is_not_evidence_of_load() -> None:
    p, clock = make(hint_ttl_s=60)
    p.observe(Observation("big", ok=True, hint=HOT))
    clock.now += 61
    for _ in range(3):
        p.observe(Observation("big", ok=False, timed_out=True))
    assert p.choose() == "big"


def test_sm_util_is_preferred_over_kv_util_when_the_engine_has_a_gpu() -> None:
    p, _ = make()
    p.observe(Observation("big", ok=True, hint=LoadHint(kv_util=0.2, sm_util=99.0)))
    for _ in range(3):
        p.observe(Observation("big", ok=False, timed_out=True))
    assert p.choose() == "small"


def test_recovery_waits_for_the_cool_down_then_switches_back() -> None:
    p, clock = make(cooldown_s=30)
    p.observe(Observation("big", ok=True, hint=HOT))
    for _ in range(3):
        p.observe(Observation("big", ok=False, timed_out=True))
    for _ in range(5):
        clock.now += 1
        p.observe(Observation("small", ok=True, hint=COOL))
    assert p.choose() == "small"  # healthy, but the cool-down has not passed
    clock.now += 25
    assert p.choose() == "big"
    assert p.switches[-1].direction == "recover" and "cool-down 30 s passed" in p.switches[-1].reason


def test_recovery_needs_load_below_the_lower_threshold() -> None:
    p, clock = make(cooldown_s=5)
    p.observe(Observation("big", ok=True, hint=HOT))
    for _ in range(3):
        p.observe(Observation("big", ok=False, timed_out=True))
    clock.now += 10
    for _ in range(5):
        p.observe(Observation("small", ok=True, hint=WARM))  # 90%: below 95 but not below 80
    assert p.choose() == "small"
    p.observe(Observation("small", ok=True, hint=COOL))
    assert p.choose() == "big"


def test_a_failed_recovery_doubles_the_next_cool_down() -> None:
    p, clock = make(cooldown_s=10, max_cooldown_s=25)
    for expected in (20, 25, 25):  # doubled, then capped
        p.observe(Observation("big", ok=True, hint=HOT))
        for _ in range(3):
            p.observe(Observation("big", ok=False, timed_out=True))
        clock.now += p.cooldown_s
        for _ in range(3):
            p.observe(Observation("small", ok=True, hint=COOL))
        assert p.choose() == "big"
        p.observe(Observation("big", ok=True, hint=HOT))
        for _ in range(3):
            p.observe(Observation("big", ok=False, timed_out=True))
        assert p.choose() == "small" and p.cooldown_s == expected
        clock.now += expected
        for _ in range(3):
            p.observe(Observation("small", ok=True, hint=COOL))
        assert p.choose() == "big"


def test_three_models_step_down_one_at_a_time() -> None:
    p, _ = make(("large", "medium", "small"))
    p.observe(Observation("large", ok=True, hint=HOT))
    for m in ("large", "medium"):
        for _ in range(3):
            p.observe(Observation(m, ok=False, timed_out=True))
    assert p.choose() == "small"
    for _ in range(5):
        p.observe(Observation("small", ok=False, timed_out=True))
    assert p.choose() == "small" and len(p.switches) == 2


def test_outcomes_for_a_model_no_longer_current_are_not_counted() -> None:
    p, _ = make()
    p.observe(Observation("big", ok=True, hint=HOT))
    for _ in range(3):
        p.observe(Observation("big", ok=False, timed_out=True))
    for _ in range(3):  # stragglers sent to "big" before the switch
        p.observe(Observation("small", ok=False, timed_out=True))
        p.observe(Observation("big", ok=False, timed_out=True))
    assert p.choose() == "small" and len(p.switches) == 1


def test_switches_are_exported_as_a_prometheus_counter() -> None:
    from prometheus_client import CollectorRegistry, generate_latest

    reg = CollectorRegistry()
    p = AutoFallbackPolicy(FallbackConfig(("big", "small")), registry=reg)
    p.observe(Observation("big", ok=True, hint=HOT))
    for _ in range(3):
        p.observe(Observation("big", ok=False, timed_out=True))
    text = generate_latest(reg).decode()
    assert 'zg_client_model_switches_total{direction="fallback",from_model="big",to_model="small"} 1.0' in text


@pytest.mark.parametrize("kwargs", [
    {"models": ()}, {"models": ("a", "a")}, {"models": ("a",), "util_threshold_pct": 0},
    {"models": ("a",), "recover_below_pct": 99}, {"models": ("a",), "timeouts_to_fallback": 0},
    {"models": ("a",), "cooldown_s": -1},
])
def test_invalid_config_is_rejected_with_a_clear_message(kwargs: dict) -> None:
    with pytest.raises(ValueError):
        FallbackConfig(**kwargs)


# --- properties: no flapping ------------------------------------------------------------------

signal = st.tuples(
    st.floats(min_value=0.0, max_value=20.0),                      # seconds since the previous request
    st.sampled_from(["ok", "timeout", "error"]),
    st.one_of(st.none(), st.floats(min_value=0.0, max_value=1.0)),  # kv_util in the answer, if any
)


Entry = tuple[float, str, str, LoadHint | None]


def run(p: AutoFallbackPolicy, clock: FakeClock, steps: list) -> tuple[list[Entry], dict[int, int]]:
    """Drive the policy like a client would. Returns (time, model, outcome, hint) per request, and
    for each switch made by an observation (by id), the index of the request that caused it."""
    log: list[Entry] = []
    caused_by: dict[int, int] = {}
    for dt, outcome, kv in steps:
        clock.now += dt
        model = p.choose()
        hint = LoadHint(kv_util=kv) if kv is not None and outcome != "timeout" else None
        sw = p.observe(Observation(model, ok=outcome == "ok", timed_out=outcome == "timeout", hint=hint))
        log.append((clock.now, model, outcome, hint))
        if sw is not None:
            caused_by[id(sw)] = len(log) - 1
    return log, caused_by


@settings(max_examples=300, deadline=None)
@given(st.lists(signal, max_size=120), st.sampled_from([5.0, 30.0]))
def test_recoveries_are_spaced_by_the_cool_down_and_bounded_by_elapsed_time(steps: list, cooldown: float) -> None:
    p, clock = make(("big", "mid", "small"), cooldown_s=cooldown)
    start = clock.now
    run(p, clock, steps)
    previous = None
    for sw in p.switches:
        if sw.direction == "recover":
            assert previous is not None and sw.at_s - previous.at_s >= cooldown
        previous = sw
    recoveries = sum(sw.direction == "recover" for sw in p.switches)
    fallbacks = len(p.switches) - recoveries
    assert recoveries <= math.floor((clock.now - start) / cooldown)
    assert fallbacks <= recoveries + 2  # each extra step down must be paid for by a recovery


@settings(max_examples=300, deadline=None)
@given(st.lists(signal, max_size=120))
def test_every_fallback_follows_fresh_timeouts_under_high_load(steps: list) -> None:
    p, clock = make(cooldown_s=5.0)
    log, caused_by = run(p, clock, steps)
    for sw in (s for s in p.switches if s.direction == "fallback"):
        i = caused_by[id(sw)]
        tail = log[max(0, i - 2): i + 1]
        assert len(tail) == 3 and all(m == sw.from_model and o == "timeout" for _, m, o, _ in tail)
        hinted = [(t, h) for t, _, _, h in log[: i + 1] if h is not None]
        assert hinted and hinted[-1][1].util_pct > 95.0
        assert sw.at_s - hinted[-1][0] <= 60.0  # fresh: within hint_ttl_s


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(min_value=0.0, max_value=100.0), min_size=1, max_size=200),
       st.floats(min_value=0.96, max_value=1.0), st.floats(min_value=0.0, max_value=0.5))
def test_alternating_signals_never_switch(gaps: list, high: float, low: float) -> None:
    p, clock = make(cooldown_s=1.0)
    for i, dt in enumerate(gaps):
        clock.now += dt
        model = p.choose()
        if i % 2 == 0:
            p.observe(Observation(model, ok=False, timed_out=True))
        else:
            p.observe(Observation(model, ok=True, hint=LoadHint(kv_util=high if i % 4 == 1 else low)))
    assert p.switches == []

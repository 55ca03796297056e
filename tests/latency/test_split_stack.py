"""latency-split against the real engine (`zgtool serve --model null`) and pygw/nginx via LocalStack."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from zgtool.latency.analysis.phases import analyse, decompose
from zgtool.latency.config import SplitConfig
from zgtool.latency.records import RequestSample
from zgtool.latency.schedule.runner import measure_targets
from zgtool.targets import Target

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def stack_urls() -> Iterator[dict[str, str]]:
    from zgtool.errors import ZgError
    from zgtool.gateway.supervisor import LocalStack, StackConfig

    try:
        stack = LocalStack(StackConfig(model="null", paths=("nginx", "pygw")))
        st = stack.__enter__()
    except ZgError as exc:
        pytest.fail(f"the local stack did not start: {exc.message}")
    try:
        yield dict(st.urls)
    finally:
        stack.__exit__(None, None, None)


def _run(urls: dict[str, str], stream: bool, n: int = 6) -> dict[str, list[RequestSample]]:
    names = ["direct", "nginx", "pygw"]
    cfg = SplitConfig(num_requests=n, stream=stream, max_tokens=8, warmup=1, resamples=200, rounds=2)
    samples = measure_targets([Target(k, urls[k]) for k in names], cfg)
    return dict(zip(names, samples, strict=True))


@pytest.mark.parametrize("stream", [True, False])
def test_engine_parts_on_every_path_and_gw_parts_only_through_pygw(stack_urls: dict[str, str],
                                                                   stream: bool) -> None:
    by_path = _run(stack_urls, stream)
    for path, samples in by_path.items():
        assert all(s.ok for s in samples), (path, [s.error for s in samples])
        for s in samples:
            assert {"queue", "prefill", "decode", "detok", "safety", "total"} <= set(s.server_timing), path
            has_gw = any(k.startswith("gw_") for k in s.server_timing)
            assert has_gw == (path == "pygw"), (path, s.server_timing)


@pytest.mark.parametrize("stream", [True, False])
def test_attributed_parts_never_exceed_the_client_total(stack_urls: dict[str, str], stream: bool) -> None:
    # Per request: never more than the 0.5 ms the analysis itself tolerates between the engine's
    # clock and the client's (negative_outside_share); and strictly within the total for >= 90%
    # of requests, so a systematic bias still fails. (One 0.19 ms inversion on a 0.23 ms null-model
    # stream was seen in three full runs on the busy 2-core box; its cause is not yet known.)
    for samples in _run(stack_urls, stream).values():
        strict = 0
        for s in samples:
            rows = decompose(s, stream)
            assert s.total_ms is not None
            parts = sum(v for k, v in rows.items() if k != "network_client_ms")
            assert parts <= s.total_ms + 0.5, (parts, s)
            assert rows["network_client_ms"] >= -0.5
            strict += parts <= s.total_ms
        assert strict >= 0.9 * len(samples), f"{strict} of {len(samples)} within the client total"


def test_stream_ttft_before_total_with_the_engine_timing_event(stack_urls: dict[str, str]) -> None:
    for samples in _run(stack_urls, True).values():
        for s in samples:
            # equal when the first token and the end arrive in one segment (kernel receive times)
            assert s.ttft_ms is not None and s.total_ms is not None and s.ttft_ms <= s.total_ms
            assert s.output_tokens == 8 and s.tpot_ms is not None
            # the engine's stream header is written before decoding; decode comes from the event
            assert s.server_timing["total"] >= s.server_timing["decode"]


def test_gateway_tax_is_reported_per_phase_with_intervals(stack_urls: dict[str, str]) -> None:
    names = ["direct", "pygw"]
    cfg = SplitConfig(num_requests=12, stream=False, max_tokens=8, warmup=1, resamples=500, rounds=2)
    targets = [Target(k, stack_urls[k]) for k in names]
    res = analyse(targets, measure_targets(targets, cfg), cfg)
    diffs = {d.phase: d for d in res.differences}
    assert {"gw_auth_ms", "gw_other_ms", "total_ms"} <= set(diffs)
    assert all(d.verdict in ("higher", "lower", "not significant") for d in diffs.values())
    gw_auth = diffs["gw_auth_ms"]
    assert gw_auth.diff_ms is not None and gw_auth.diff_ms >= 0 and gw_auth.verdict != "lower"

"""latency-split against real local servers: an origin, a gateway in front of it, https, errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from zgtool.errors import TargetUnreachable
from zgtool.latency.analysis.phases import analyse, attribute, decompose, phase
from zgtool.latency.config import SplitConfig
from zgtool.latency.records import RequestSample
from zgtool.latency.schedule.runner import measure_targets
from zgtool.targets import Target

FAST = {"max_tokens": 4, "warmup": 1, "resamples": 200, "rounds": 2}


def split(urls: list[str], **kw: object) -> tuple[list[Target], list[list[RequestSample]], SplitConfig]:
    cfg = SplitConfig(**{"num_requests": 6, **FAST, **kw})  # type: ignore[arg-type]
    targets = [Target(f"t{i}", u) for i, u in enumerate(urls)]
    return targets, measure_targets(targets, cfg), cfg


@pytest.mark.parametrize("stream", [True, False])
def test_gateway_parts_appear_only_on_the_gateway_path(origin: str, gateway: str, stream: bool) -> None:
    _, (direct, via_gw), _ = split([origin, gateway], stream=stream)
    assert all(s.ok for s in direct + via_gw)
    assert not any(k.startswith("gw_") for s in direct for k in s.server_timing)
    assert all("gw_auth" in s.server_timing for s in via_gw)
    # both paths carry the engine's parts (for streams from the timing event at the end)
    assert all({"queue", "prefill", "decode", "total"} <= set(s.server_timing) for s in direct + via_gw)


@pytest.mark.parametrize("stream", [True, False])
def test_attributed_parts_sum_to_no_more_than_the_measured_total(origin: str, gateway: str, stream: bool) -> None:
    _, per_target, _ = split([origin, gateway], stream=stream)
    for s in (s for samples in per_target for s in samples):
        rows = decompose(s)
        attributed = sum(v for k, v in rows.items() if k != "network_client_ms")
        assert s.total_ms is not None and attributed <= s.total_ms
        assert rows["network_client_ms"] >= 0
        assert sum(attribute(s.server_timing)[0].values()) <= s.total_ms


def test_tls_phase_only_for_https_and_dns_only_for_names(origin: str, tls_origin: tuple[str, Path]) -> None:
    url, ca = tls_origin
    _, (plain, tls), _ = split([origin, url], verify=str(ca), new_connection=True)
    assert all(s.ok for s in plain + tls), [s.error for s in plain + tls]
    assert all(s.tls_ms is None and s.dns_ms is None for s in plain)  # 127.0.0.1: nothing to resolve
    assert all(s.tls_ms is not None and s.tls_ms > 0 for s in tls)
    assert all(s.dns_ms is not None for s in tls)                      # "localhost" is resolved


def test_ttft_comes_before_the_end_of_a_stream(origin: str, gateway: str) -> None:
    _, per_target, _ = split([origin, gateway], stream=True)
    for s in (s for samples in per_target for s in samples):
        assert s.ttft_ms is not None and s.total_ms is not None
        # a client that read the whole stream in one late read (flagged as lagged) stamps the first
        # token with that read's time: equal, never after; every unflagged request shows the order
        assert 0 < s.ttft_ms <= s.total_ms and (s.lagged or s.ttft_ms < s.total_ms)
        assert s.content_events == 4 and len(s.itl_ms) == 3 and s.output_tokens == 4
        assert s.tpot_ms == pytest.approx((s.total_ms - s.ttft_ms) / 3)


def test_new_connection_pays_connect_on_every_request(origin: str) -> None:
    _, (samples,), _ = split([origin], new_connection=True)
    assert all(s.connect_ms is not None and s.new_connection for s in samples)
    assert len({s.local_port for s in samples}) == len(samples)


def test_kept_connections_pay_connect_once_per_worker(origin: str) -> None:
    # the earlier design, kept for bench/verdict_calibration.py's comparison
    _, (samples,), _ = split([origin], new_connection=False, fresh_connections=False)
    assert [s.connect_ms is not None for s in samples] == [True] + [False] * (len(samples) - 1)
    assert len({s.local_port for s in samples if s.local_port}) == 1
    _, (samples,), _ = split([origin], num_requests=9, concurrency=3, fresh_connections=False)
    assert sum(s.connect_ms is not None for s in samples) == 3


def test_keep_alive_measures_no_connect_each_block_warms_its_own(origin: str) -> None:
    # issue 25: every block opens its connections anew and warms them unmeasured, so no measured
    # request carries a connect the others do not (tests/latency/test_stats_connections.py counts them)
    _, (samples,), _ = split([origin], num_requests=9, concurrency=3, rounds=3)
    assert len(samples) == 9 and all(s.ok and s.connect_ms is None for s in samples)


def test_openai_api_gives_the_same_phases(origin: str) -> None:
    cfg = SplitConfig(num_requests=4, stream=True, **FAST)  # type: ignore[arg-type]
    (samples,) = measure_targets([Target("oa", origin, api="openai")], cfg)
    assert all(s.ok and s.ttft_ms is not None and s.output_tokens == 4 for s in samples)
    assert all("total" in s.server_timing for s in samples)  # from the zgtool_timing field


def test_a_target_that_answers_errors_is_counted_not_averaged(origin: str, flaky_origin: str) -> None:
    targets, samples, cfg = split([origin, flaky_origin], num_requests=9, warmup=0)
    res = analyse(targets, samples, cfg)
    flaky = res.targets[1]
    assert flaky.num_error == 3 and flaky.errors == {"http_529:overloaded_error": 3}
    total = phase(flaky, "total_ms")
    assert total is not None and total.count == flaky.num_ok == 6


def test_unreachable_target_stops_the_run_before_measuring(origin: str, closed_port_url: str) -> None:
    with pytest.raises(TargetUnreachable, match="cannot connect"):
        split([origin, closed_port_url])


def test_self_signed_target_without_its_ca_is_unreachable_with_a_hint(tls_origin: tuple[str, Path]) -> None:
    with pytest.raises(TargetUnreachable, match="--cacert"):
        split([tls_origin[0]])


def test_differences_name_every_phase_and_gateway_parts_count_fully(origin: str, gateway: str) -> None:
    targets, samples, cfg = split([origin, gateway], num_requests=8, stream=False)
    res = analyse(targets, samples, cfg)
    diffs = {d.phase: d for d in res.differences}
    assert {"total_ms", "gw_auth_ms", "network_client_ms"} <= set(diffs)
    # a TTFB is left out when the client could not vouch for its receive time (a busy machine can
    # flag all 8 of a path); a phase either path measured is named, with no figure if one lacks it
    vouched = [any("ttfb_ms" not in s.unvouched for s in per_target if s.ok) for per_target in samples]
    assert ("ttfb_ms" in diffs) == any(vouched)
    if "ttfb_ms" in diffs:
        assert (diffs["ttfb_ms"].diff_ms is not None) == all(vouched)
    gw = diffs["gw_auth_ms"]
    assert gw.diff_ms is not None and gw.diff_ms > 0 and gw.baseline == "t0" and gw.candidate == "t1"
    for d in res.differences:
        if d.lo_ms is not None and d.lo_ms <= 0 <= d.hi_ms:
            assert d.verdict == "not significant"

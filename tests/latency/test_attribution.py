"""Server-Timing parsing and the per-request decomposition (pure functions, no network)."""

from __future__ import annotations

import pytest

from zgtool.latency.analysis.phases import attribute, decompose, waterfall_order
from zgtool.latency.attribution.servertiming import parse_timing_event, server_timing_ms
from zgtool.latency.records import RequestSample


def test_header_parts_from_several_headers_with_quoted_descs() -> None:
    parts = server_timing_ms(['queue;dur=0.5, prefill;dur=2.25', 'gw_auth;desc="a, b";dur=0.1, miss'])
    assert parts == {"queue": 0.5, "prefill": 2.25, "gw_auth": 0.1}


def test_a_repeated_name_keeps_the_origin_value() -> None:
    assert server_timing_ms("total;dur=5, total;dur=9") == {"total": 5.0}


@pytest.mark.parametrize("payload", [
    '{"type": "zgtool_timing", "server_timing": "queue;dur=1, total;dur=3"}',
    '{"type": "zgtool_timing", "queue_ms": 1, "total_ms": 3}',
    '{"zgtool_timing": {"queue_ms": 1, "total_ms": 3}}',
    {"type": "zgtool_timing", "server_timing": {"queue": 1, "total": 3}},
])
def test_timing_event_shapes_all_parse_to_the_same_parts(payload: object) -> None:
    assert parse_timing_event(payload) == {"queue": 1.0, "total": 3.0}  # type: ignore[arg-type]


def test_engine_other_fills_the_engine_total() -> None:
    parts, left = attribute({"queue": 1.0, "prefill": 2.0, "decode": 3.0, "total": 10.0})
    assert parts == {"queue": 1.0, "prefill": 2.0, "decode": 3.0, "engine_other": 4.0}
    assert left == []


def test_gateway_total_minus_engine_total_is_the_gateway_share() -> None:
    st = {"queue": 1.0, "total": 10.0, "gw_auth": 0.5, "gw_total": 13.0, "gw_upstream": 11.0}
    parts, left = attribute(st)
    assert parts["gw_auth"] == 0.5
    assert parts["gw_other"] == pytest.approx(2.5)
    assert "gw_upstream" not in parts and left == []  # enclosing span: not counted twice


def test_unknown_parts_are_left_unattributed() -> None:
    _, left = attribute({"cdn-cache": 3.0, "total": 1.0})
    assert left == ["cdn-cache"]


def test_decomposition_sums_to_the_measured_total() -> None:
    s = RequestSample(index=0, worker=0, round=0, ok=True, connect_ms=0.2, send_ms=0.1, total_ms=20.0,
                      server_timing={"queue": 1.0, "decode": 10.0, "total": 12.0, "gw_auth": 0.3})
    rows = decompose(s)
    assert sum(rows.values()) == pytest.approx(20.0)
    assert rows["network_client_ms"] == pytest.approx(20.0 - 0.2 - 12.0 - 0.3)  # sending is in here
    assert "tls_ms" not in rows and "dns_ms" not in rows and "send_ms" not in rows


def test_waterfall_rows_are_in_request_order() -> None:
    names = {"network_client_ms", "decode_ms", "gw_auth_ms", "connect_ms", "tls_ms", "queue_ms"}
    assert waterfall_order(names) == ["connect_ms", "tls_ms", "gw_auth_ms", "queue_ms", "decode_ms",
                                      "network_client_ms"]


# --- LiteLLM forwards the engine's Server-Timing renamed (issue 14) -------------------------------

def test_litellm_renamed_engine_timing_and_its_overhead_header_are_read() -> None:
    from zgtool.latency.attribution.servertiming import timing_from_headers

    headers = [(b"llm_provider-server-timing", b"queue;dur=0.2, decode;dur=9.5, total;dur=10.1"),
               (b"x-litellm-overhead-duration-ms", b"16.3"), (b"content-type", b"application/json")]
    assert timing_from_headers(headers) == {"queue": 0.2, "decode": 9.5, "total": 10.1,
                                            "gw_litellm_overhead": 16.3}


def test_the_plain_header_wins_when_it_carries_the_engine_total() -> None:
    from zgtool.latency.attribution.servertiming import timing_from_headers

    headers = [("Server-Timing", "total;dur=5, gw_auth;dur=0.3"), ("llm_provider-server-timing", "total;dur=9")]
    assert timing_from_headers(headers) == {"total": 5.0, "gw_auth": 0.3}


def _targets_and_samples(cand_timing: dict[str, float]) -> tuple[list, list[list[RequestSample]]]:
    from zgtool.targets import Target

    def s(i: int, total: float, timing: dict[str, float]) -> RequestSample:
        return RequestSample(index=i, worker=0, round=i % 4, ok=True, total_ms=total, server_timing=dict(timing))

    direct = [s(i, 10.5 + 0.01 * i, {"decode": 9.0, "total": 10.0}) for i in range(16)]
    gateway = [s(i, 35.0 + 0.01 * i, cand_timing) for i in range(16)]
    return [Target("direct", "http://127.0.0.1:1"), Target("litellm", "http://127.0.0.1:2")], [direct, gateway]


def test_a_path_hiding_the_engine_timing_gets_no_outside_engine_tax_and_a_note() -> None:
    from zgtool.latency.analysis.phases import analyse
    from zgtool.latency.config import SplitConfig

    targets, samples = _targets_and_samples({})            # the engine's header did not reach the client
    cfg = SplitConfig(num_requests=16, stream=False, resamples=200)
    res = analyse(targets, samples, cfg)
    oe = next(d for d in res.differences if d.phase == "outside_engine_ms")
    assert oe.diff_ms is None and oe.verdict == "not measured"     # never -0.5 ms, never "not significant"
    decode = next(d for d in res.differences if d.phase == "decode_ms")
    assert decode.diff_ms is None                                      # nor a "saved" decode
    assert any(n.startswith("litellm:") and "not attributed" in n for n in res.attribution_notes)


def test_with_the_renamed_header_read_the_outside_engine_tax_is_the_hop() -> None:
    from zgtool.latency.analysis.phases import analyse
    from zgtool.latency.config import SplitConfig

    targets, samples = _targets_and_samples({"decode": 9.0, "total": 10.0, "gw_litellm_overhead": 16.3})
    res = analyse(targets, samples, SplitConfig(num_requests=16, stream=False, resamples=200))
    oe = next(d for d in res.differences if d.phase == "outside_engine_ms")
    assert oe.diff_ms == pytest.approx(24.5) and oe.verdict == "higher" and oe.method == "rounds"
    assert res.attribution_notes == []


def test_a_significantly_negative_outside_engine_tax_is_kept_and_called_a_difference_within_noise() -> None:
    from zgtool.latency.analysis.phases import analyse
    from zgtool.latency.config import SplitConfig

    # the candidate's engine total covers more than the engine did (e.g. a gateway's own total
    # under the engine's name): outside-engine time shrinks below the direct path's
    targets, samples = _targets_and_samples({"decode": 9.0, "total": 34.8})
    res = analyse(targets, samples, SplitConfig(num_requests=16, stream=False, resamples=200))
    oe = next(d for d in res.differences if d.phase == "outside_engine_ms")
    assert oe.diff_ms is not None and oe.diff_ms < 0 and oe.verdict == "lower"
    note = next(n for n in res.attribution_notes if n.startswith("litellm:"))
    assert "within noise" in note and "not a saving" in note and "engine total" in note

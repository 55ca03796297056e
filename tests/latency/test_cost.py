"""The gateway's cost in money (issue 39 item 6): CPU seconds per request times --core-hour-price as dollars per
million output tokens, the gateway's net of what its processes used while the baseline ran; GPU time where
priced; "not measured" for processes the client cannot read. Live: the real null engine behind real nginx."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from zgtest import run_zgtool

from zgtool.latency.analysis.cost import NOT_MEASURED, cost, cost_lines
from zgtool.latency.records import SplitResult, TargetResult, Throughput


def _target(name: str, cpu: dict[str, float] | None, *, ok: int = 100, out_tokens: int | None = 1000,
            duration_s: float = 2.0) -> TargetResult:
    return TargetResult(name=name, url="http://x", api="openai", scheme="http", samples=[], errors={}, num_ok=ok,
                        num_error=0, throughput=Throughput(duration_s, ok, ok / duration_s, None, out_tokens, None),
                        cpu_ms_per_request=cpu)


def _result(*targets: TargetResult) -> SplitResult:
    return SplitResult(config={}, definitions={}, targets=list(targets), differences=[], waterfall_phases=[],
                       metric_phases=[], unattributed_parts={})


def test_the_gateways_cost_is_its_cpu_net_of_the_baseline_times_the_price_per_million_tokens() -> None:
    # 2.5 ms of nginx CPU per request on its path, 0.5 ms while the direct path ran: 2 ms = 0.002 core-s;
    # $0.36 per core-hour = $0.0001 per core-s -> $2e-7 per request; 10 output tokens each -> $0.02 per million
    res = _result(_target("direct", {"engine": 4.0, "nginx": 0.5}), _target("nginx", {"engine": 4.0, "nginx": 2.5}))
    data = cost(res, 0.36)
    direct, via = data["targets"]
    assert "gateway" not in direct
    assert via["gateway"]["processes"] == ["nginx"]
    assert via["gateway"]["cpu_s_per_request"] == pytest.approx(0.002)
    assert via["gateway"]["usd_per_million_output_tokens"] == pytest.approx(0.02)
    assert via["gateway"]["usd_per_million_requests"] == pytest.approx(0.2)
    assert via["processes"]["engine"]["usd_per_million_output_tokens"] == pytest.approx(0.04)
    (line,) = cost_lines(data)
    assert line.startswith("nginx: its gateway (nginx) costs $0.02 per million output tokens at $0.36 per core-hour")


def test_a_path_whose_processes_are_not_local_is_not_measured_never_zero() -> None:
    data = cost(_result(_target("direct", None), _target("remote-gw", None)), 0.05)
    assert data["targets"][1]["not_measured"] == NOT_MEASURED and "gateway" not in data["targets"][1]
    assert cost_lines(data) == [f"remote-gw: the gateway's cost is {NOT_MEASURED}"]


def test_gpu_time_is_the_wall_time_each_answered_request_held_the_engine() -> None:
    # 2 s for 100 requests: 20 ms of GPU each; $3.6 per GPU-hour = $0.001 per s -> $2e-5 per request; 10 tokens
    data = cost(_result(_target("direct", None)), None, 3.6)
    g = data["targets"][0]["engine_gpu"]
    assert g["gpu_s_per_request"] == pytest.approx(0.02) and g["usd_per_million_output_tokens"] == pytest.approx(2.0)
    assert "processes" not in data["targets"][0] and "not_measured" not in data["targets"][0]


def test_no_output_token_counts_gives_dollars_per_million_requests() -> None:
    res = _result(_target("d", {"gw": 0.0}, out_tokens=None), _target("g", {"gw": 1.0}, out_tokens=None))
    (line,) = cost_lines(cost(res, 3.6))
    assert "$1.00 per million requests (no output token counts)" in line


@pytest.fixture(scope="module")
def engine_behind_nginx(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, int, str, int]]:
    from engine_live import child

    from zgtool.gateway.nginx import find_nginx
    from zgtool.gateway.supervisor import LocalStack, StackConfig

    try:
        find_nginx()
    except Exception as exc:  # noqa: BLE001 - the binary is missing on this machine
        pytest.skip(f"nginx not available: {exc}")
    with child(tmp_path_factory.mktemp("cost"), keyed=False) as live, \
            LocalStack(StackConfig(upstream=live.url, paths=("nginx",))) as st:
        nginx_pid = next(c.pid for c in st.children if c.name.startswith("nginx") and c.pid is not None)
        assert live.proc is not None
        yield live.url, live.proc.pid, st.urls["nginx"], nginx_pid


def test_latency_split_prices_nginx_per_million_tokens_in_the_verdict_json_and_report(
        engine_behind_nginx: tuple[str, int, str, int], tmp_path: Path) -> None:
    engine, engine_pid, front, nginx_pid = engine_behind_nginx
    out = tmp_path / "split.json"
    r = run_zgtool("latency-split", engine, front, "-n", "16", "--warmup", "1", "--cpu-pid", f"engine={engine_pid}",
                   "--cpu-pid", f"nginx={nginx_pid}", "--core-hour-price", "0.05", "-o", str(out), "--brief")
    assert r.returncode == 0, r.stderr
    data = json.loads(out.read_text())["data"]["cost"]
    via = data["targets"][1]
    assert via["name"] == front and via["gateway"]["processes"] == ["nginx"]
    assert via["gateway"]["usd_per_million_output_tokens"] is not None
    assert via["gateway"]["cpu_s_per_request"] >= 0
    assert f"{front}: its gateway (nginx) costs $" in r.stdout and "per million output tokens" in r.stdout
    html = tmp_path / "r.html"
    assert run_zgtool("report", "html", str(out), "-o", str(html)).returncode == 0
    assert 'id="cost"' in html.read_text() and "less the baseline" in html.read_text()


def test_a_negative_price_is_one_line_and_exit_2() -> None:
    r = run_zgtool("latency-split", "http://127.0.0.1:1", "--core-hour-price", "-1")
    assert r.returncode == 2 and "--core-hour-price" in r.stderr

"""Real k6 runs against a real uvicorn app: phases per scenario, failures, unreachable targets, ramp."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from zgtool.errors import ExitCode
from zgtool.loadtest import BenchConfig, RampConfig, find_k6, run_bench, run_ramp
from zgtool.loadtest.render import bench_verdict
from zgtool.loadtest.summary import PHASES
from zgtool.targets import Target


def test_bench_cli_writes_a_bench_k6_result_with_every_phase_per_scenario(asgi_url, cli, tmp_path):
    out = tmp_path / "bench.json"
    # a relative --run-dir: k6 runs in its script folder, so zgtool must hand it absolute paths
    proc = cli("bench", "--direct", asgi_url, "--gateway", asgi_url, "--rate", "10", "--duration", "1s",
               "--no-progress", "--run-dir", "run", "-o", out, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(out.read_text())
    assert result["schema"] == "zgtool.result/1" and result["kind"] == "bench.k6"
    data = result["data"]
    assert set(data["scenarios"]) == {"gateway", "direct", "direct_stream"}
    for name, s in data["scenarios"].items():
        assert s["requests"] >= 10 and s["failures"] == 0 and s["dropped_iterations"] == 0, name
        assert s["checks_failed"] == 0, name  # streaming bodies really ended with message_stop
        for phase in PHASES:
            assert s[phase]["count"] == s["requests"] and s[phase]["unit"] == "ms", (name, phase)
            assert s[phase]["p50"] <= s[phase]["p95"] <= s[phase]["max"]
    assert data["failure_rate"] == 0 and data["load_generator_saturated"] is False
    assert data["ttft_ms"] is None and any("not time to first token" in n for n in data["notes"])
    # uvicorn keeps its connections alive: no VU had to reconnect, and nothing is said about it
    assert all(s["reconnects"] == 0 for s in data["scenarios"].values())
    assert not any("new TCP connection" in n for n in data["notes"])
    # what each path adds to direct's median, with an interval over its requests (k6's raw points)
    for name in ("gateway", "direct_stream"):
        d = data["differences"][name]
        assert d["vs"] == "direct" and d["n"] >= 10 and d["lo_ms"] <= d["p50_ms"] <= d["hi_ms"], d
        assert "unpaired" in d["method"]
    assert "interval [" in proc.stdout.splitlines()[0] or "interval [" in proc.stdout
    assert (tmp_path / "run" / "summary.json").exists()
    # the table shows each phase for each path
    assert "duration" in proc.stdout and "direct_stream" in proc.stdout

    gate = tmp_path / "g.toml"
    gate.write_text('rules = ["failure_rate < 0.01", "dropped_iterations == 0",'
                    ' "direct_stream.http_req_receiving.count == direct_stream.requests"]\n')
    assert cli("gate", "--policy", gate, out).returncode == 0


def test_failed_requests_are_counted_per_scenario(asgi_url, tmp_path):
    payload = tmp_path / "fail.json"
    payload.write_text(json.dumps({"model": "default", "max_tokens": 4,
                                   "messages": [{"role": "user", "content": "fail-me"}]}))
    cfg = BenchConfig(rate_rps=5, duration_s=1.0, scenarios=("direct",), payload=payload)
    result = run_bench(cfg, direct=Target("direct", asgi_url), gateway=None, k6=find_k6(),
                       run_dir=tmp_path / "run", progress=False)
    s = result.scenarios["direct"]
    assert s.requests >= 5 and s.failures == s.requests and result.failure_rate == 1.0
    assert s.checks_failed == s.requests  # the 500 also fails the status check
    # what failed, said once per scenario: the URL, the status and the start of the server's answer
    said = [n for n in result.notes if n.startswith("direct: a failed request: ")]
    assert said == [f'direct: a failed request: POST {asgi_url}/v1/messages -> HTTP 500: {{"type": "error", '
                    '"error": {"type": "api_error", "message": "asked to fail"}}'], result.notes


def test_requests_that_find_their_kept_alive_connection_closed_are_counted_and_named(asgi_url, tmp_path):
    """llama-server closes its connection after every streamed answer: k6 then connects anew for the next
    request of that VU, and the duration includes the connect. A VU's first request is not counted."""
    payload = tmp_path / "close.json"
    payload.write_text(json.dumps({"model": "default", "max_tokens": 4,
                                   "messages": [{"role": "user", "content": "close-me"}]}))
    cfg = BenchConfig(rate_rps=10, duration_s=1.0, pre_allocated_vus=2, max_vus=2, scenarios=("direct",),
                      payload=payload)
    result = run_bench(cfg, direct=Target("direct", asgi_url), gateway=None, k6=find_k6(),
                       run_dir=tmp_path / "run", progress=False)
    s = result.scenarios["direct"]
    assert s.failures == 0 and s.requests >= 8, result.notes
    assert s.requests - 2 <= s.reconnects <= s.requests - 1, (s.reconnects, s.requests)
    said = [n for n in result.notes if "new TCP connection" in n]
    assert len(said) == 1 and said[0].startswith(f"direct: {s.reconnects} of {s.requests} requests went out on a "
                                                 "new TCP connection"), result.notes


def test_a_target_given_with_its_v1_is_asked_at_v1_messages_not_v1_v1(asgi_url, cli, tmp_path):
    """The README's form (http://host:8000/v1): k6 asked /v1/v1/messages and every request failed 404."""
    cfg = BenchConfig(rate_rps=5, duration_s=1.0, scenarios=("direct", "gateway"))
    result = run_bench(cfg, direct=Target("direct", asgi_url + "/v1"), gateway=Target("gw", asgi_url + "/v1/"),
                       k6=find_k6(), run_dir=tmp_path / "run", progress=False)
    assert result.requests >= 10 and result.failures == 0, result.notes
    proc = cli("bench", "--direct", asgi_url + "/nowhere", "--scenarios", "direct", "--rate", "5", "--duration",
               "1s", "--no-progress", "--api", "anthropic", "--model", "default")
    assert proc.returncode == ExitCode.UNRELIABLE, proc.stderr
    assert f"direct: a failed request: POST {asgi_url}/nowhere/v1/messages -> HTTP 404" in proc.stderr


def test_dropped_iterations_say_the_load_generator_could_not_keep_the_rate(asgi_url, tmp_path):
    from rich.console import Console

    from zgtool.loadtest.render import render_bench

    payload = tmp_path / "slow.json"
    payload.write_text(json.dumps({"model": "default", "max_tokens": 4,
                                   "messages": [{"role": "user", "content": "slow-me"}]}))
    cfg = BenchConfig(rate_rps=20, duration_s=1.0, pre_allocated_vus=1, max_vus=1, scenarios=("direct",),
                      payload=payload)
    result = run_bench(cfg, direct=Target("direct", asgi_url), gateway=None, k6=find_k6(),
                       run_dir=tmp_path / "run", progress=False)
    assert result.scenarios["direct"].dropped_iterations > 5 and result.load_generator_saturated
    assert result.failures == 0
    console = Console(record=True, width=160)
    render_bench(result, console)
    assert "the load generator could not keep the rate" in console.export_text()


def test_unreachable_target_exits_3_before_k6_runs(cli, free_port, tmp_path):
    proc = cli("bench", "--direct", f"http://127.0.0.1:{free_port}", "--scenarios", "direct",
               "--no-progress", "--run-dir", tmp_path / "run")
    assert proc.returncode == ExitCode.UNREACHABLE
    assert "unreachable" in proc.stderr and not (tmp_path / "run").exists()


def test_gateway_scenario_without_a_gateway_is_a_usage_error(asgi_url, cli):
    proc = cli("bench", "--direct", asgi_url, "--duration", "1s")
    assert proc.returncode == ExitCode.USAGE and "needs --gateway" in proc.stderr


def test_bad_flags_exit_2_with_one_line(cli, asgi_url):
    for args, msg in ((("--duration", "soon"), "expected a duration"),
                      (("--scenarios", "direct,sideways"), "unknown sideways"),
                      (("--rate", "0"), "at least 1")):
        proc = cli("bench", "--direct", asgi_url, *args)
        assert proc.returncode == ExitCode.USAGE and msg in proc.stderr, (args, proc.stderr)


def test_ramp_reports_p95_per_rate_step_for_each_path(asgi_url, tmp_path):
    cfg = RampConfig(rates=(5, 10), step_s=1.0, warmup_s=0.5)
    result = run_ramp(cfg, {"direct": Target("direct", asgi_url), "again": Target("again", asgi_url)},
                      k6=find_k6(), run_dir=tmp_path / "run", progress=False)
    assert [p.name for p in result.paths] == ["direct", "again"]
    for path in result.paths:
        assert [s.rate_rps for s in path.steps] == [5, 10]
        assert all(s.requests > 0 and s.failures == 0 and s.p95_ms > 0 for s in path.steps)
        assert path.knee_reason  # either a knee or "stayed under"


def test_a_ramp_on_a_bare_url_asks_for_the_model_the_engine_serves(null_engine, cli, tmp_path):
    """The ramp sent the payload's placeholder model "default": every request of every step was a 404 and the
    command still exited 0. Like bench, it now asks for the model the engine serves."""
    out = tmp_path / "ramp.json"
    proc = cli("bench", "--ramp", "--direct", null_engine, "--rates", "4", "--step", "1s", "--warmup", "0",
               "--ttft-at-knee", "0", "--no-progress", "-o", out)
    assert proc.returncode == 0, proc.stderr
    assert "detected model 'null'" in proc.stderr
    (path,) = json.loads(out.read_text())["data"]["paths"]
    assert path["steps"][0]["requests"] >= 3 and path["steps"][0]["failures"] == 0, path


def test_a_ramp_whose_every_request_failed_exits_unreliable_and_says_what_failed(asgi_url, cli, tmp_path):
    payload = tmp_path / "fail.json"
    payload.write_text(json.dumps({"model": "default", "max_tokens": 4,
                                   "messages": [{"role": "user", "content": "fail-me"}]}))
    out = tmp_path / "ramp.json"
    proc = cli("bench", "--ramp", "--direct", asgi_url, "--payload", payload, "--rates", "4", "--step", "1s",
               "--warmup", "0", "--ttft-at-knee", "2s", "--no-progress", "-o", out)
    assert proc.returncode == ExitCode.UNRELIABLE, proc.stderr
    said = f"direct: a failed request: POST {asgi_url}/v1/messages -> HTTP 500"
    assert "all" in proc.stderr and said in proc.stderr
    data = json.loads(out.read_text())["data"]       # the result is still written, with the failure named
    assert any(n.startswith(said) for n in data["notes"])
    assert data["ttft_at_knee"] == []                 # no knee to measure TTFT at: not measured


def test_scenarios_take_turns_in_rounds_and_the_gateway_is_paired_with_direct_round_by_round(asgi_url, tmp_path):
    """Run one after another whole, the first scenario took the machine's drift (or its warm-up) alone: an A/A
    gateway came out 1.6 ms faster than direct in a run here. In rounds, every path runs in every turn."""
    cfg = BenchConfig(rate_rps=10, duration_s=3.0, scenarios=("direct", "gateway"), rounds=3)
    result = run_bench(cfg, direct=Target("direct", asgi_url), gateway=Target("gw", asgi_url), k6=find_k6(),
                       run_dir=tmp_path / "run", progress=False)
    assert result.config["rounds"] == 3
    for s in result.scenarios.values():
        # exactly rate x duration: k6 starts one more now and then at a turn's end, which sends nothing
        assert s.requests == 30 and s.failures == 0 and s.dropped_iterations == 0, s
        assert s.achieved_rps == pytest.approx(10.0)
        assert s.p50_lo_ms is not None and s.p50_lo_ms <= s.http_req_duration.p50 <= s.p50_hi_ms
    from zgtool.loadtest.points import ROUND_KEY, read_points

    points = read_points(tmp_path / "run" / "points.csv.gz")
    for path in ("direct", "gateway"):     # every request carries its turn: three per path, rate x slice in each
        assert sorted(points[path][ROUND_KEY]) == [0.0] * 10 + [1.0] * 10 + [2.0] * 10
        assert len(points[path][ROUND_KEY]) == len(points[path]["http_req_duration"])
    g = result.differences["gateway"]
    assert g["rounds"] == 3 and g["method"].startswith("paired by rounds")
    assert "paired by 3 rounds in which the k6 scenarios took turns" in bench_verdict(result)
    from rich.console import Console

    from zgtool.loadtest.render import render_bench

    console = Console(record=True, width=120)
    render_bench(result, console)
    assert "10 req/s for 3 s per scenario (taking turns in 3 rounds)" in " ".join(console.export_text().split())
    # one turn each (the old order): the interval is over requests and says what it does not cover
    one = run_bench(replace(cfg, rounds=1), direct=Target("direct", asgi_url), gateway=Target("gw", asgi_url),
                    k6=find_k6(), run_dir=tmp_path / "one", progress=False)
    assert one.config["rounds"] == 1 and one.differences["gateway"]["method"].startswith("unpaired")
    assert "a drift between them is not covered" in bench_verdict(one)


def test_bench_accepts_gzip_as_the_sdks_do_and_k6_reads_the_compressed_answer(asgi_url, cli, tmp_path):
    # the app answers "gzip-me" compressed when the request accepts gzip (a compressing gateway), 406 otherwise
    payload = tmp_path / "gz.json"
    payload.write_text(json.dumps({"model": "default", "max_tokens": 4,
                                   "messages": [{"role": "user", "content": "gzip-me"}]}))
    out = tmp_path / "bench.json"
    proc = cli("bench", "--direct", asgi_url, "--scenarios", "direct", "--rate", "5", "--duration", "1s",
               "--payload", payload, "--no-progress", "-o", out, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    s = json.loads(out.read_text())["data"]["scenarios"]["direct"]
    assert s["requests"] >= 5 and s["failures"] == 0 and s["checks_failed"] == 0
    # a header the user names replaces the default of that name, whatever its case
    proc = cli("bench", "--direct", asgi_url, "--scenarios", "direct", "--rate", "5", "--duration", "1s",
               "--payload", payload, "--no-progress", "-H", "Accept-Encoding: identity", "-o", out, cwd=tmp_path)
    s = json.loads(out.read_text())["data"]["scenarios"]["direct"]
    assert s["requests"] >= 5 and s["failures"] == s["requests"], proc.stderr

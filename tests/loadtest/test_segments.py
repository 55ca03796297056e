"""Load past one machine on k6's own distributed engine: execution segments run as separate k6
processes, merged from their raw points; the same scenario as a k6-operator TestRun."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from zgtest import ZGTOOL, run_zgtool

from zgtool.errors import UsageError
from zgtool.loadtest.segments import Segment
from zgtool.stats import percentile

ROOT = Path(__file__).resolve().parents[2]
RATE, DURATION = 40, "3s"


def test_segment_i_of_n_is_k6s_execution_segment_of_an_equal_split():
    assert Segment.parse("1/3").k6_args() == ["--execution-segment", "0:1/3",
                                              "--execution-segment-sequence", "0,1/3,2/3,1"]
    assert Segment.parse("3/3").k6_segment == "2/3:1"
    assert Segment.parse("1/1").k6_segment == "0:1"
    for bad in ("0/3", "4/3", "1/0", "x", "1-3"):
        with pytest.raises(UsageError):
            Segment.parse(bad)


def test_a_bad_segment_is_a_one_line_usage_error(cli, asgi_url):
    proc = cli("bench", "--direct", asgi_url, "--segment", "4/3")
    assert proc.returncode == 2 and "--segment must be i/N" in proc.stderr


def _bench_args(url: str, out: Path, run_dir: Path) -> list[str]:
    return ["bench", "--direct", url, "--scenarios", "direct", "--rate", str(RATE), "--duration", DURATION,
            "--max-vus", "20", "--no-progress", "--run-dir", str(run_dir), "-o", str(out)]


def _run_segments(url: str, n: int, tmp: Path) -> list[Path]:
    """All N segments as N k6 processes started at once, as N machines (or pods) would run them."""
    tmp.mkdir(parents=True, exist_ok=True)
    outs = [tmp / f"seg{i}of{n}.json" for i in range(1, n + 1)]
    procs = [subprocess.Popen([*ZGTOOL, *_bench_args(url, out, tmp / f"run{i}of{n}"), "--segment", f"{i}/{n}"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for i, out in enumerate(outs, start=1)]
    for p in procs:
        _, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
    return outs


@pytest.fixture(scope="module")
def runs(asgi_url: str, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path | list[Path]]:
    """One unsegmented run ("whole") and the runs of 2 and of 3 segments, made once for this module's
    tests (each k6 run is ~4 s of this machine)."""
    tmp = tmp_path_factory.mktemp("segments")
    whole = tmp / "whole.json"
    proc = run_zgtool(*_bench_args(asgi_url, whole, tmp / "run-whole"), timeout_s=300)
    assert proc.returncode == 0, proc.stderr
    return {"whole": whole, **{str(n): _run_segments(asgi_url, n, tmp / f"n{n}") for n in (2, 3)}}


@pytest.mark.parametrize("n", [2, 3])
def test_merged_segments_equal_one_unsegmented_run(runs, cli, tmp_path: Path, n: int):
    whole, segs = runs["whole"], runs[str(n)]
    merged = tmp_path / "merged.json"
    proc = cli("bench", "merge", *segs, "-o", merged)
    assert proc.returncode == 0, proc.stderr

    one = json.loads(whole.read_text())["data"]["scenarios"]["direct"]
    m = json.loads(merged.read_text())["data"]
    got = m["scenarios"]["direct"]
    assert m["config"]["segments"] == n and "merged from" in m["notes"][0]
    assert abs(got["requests"] - one["requests"]) <= 0.05 * one["requests"]
    assert abs(got["achieved_rps"] - one["achieved_rps"]) <= 0.05 * one["achieved_rps"]
    # each segment really ran its share of the rate, not the whole rate
    shares = [json.loads(s.read_text())["data"]["scenarios"]["direct"]["requests"] for s in segs]
    assert sum(shares) == got["requests"] and all(0.5 < k / (one["requests"] / n) < 1.5 for k in shares)
    # the merged percentiles are the percentiles of every point of every segment
    points = [v for s in segs for v in json.loads(s.read_text())["data"]["points"]["direct"]["http_req_duration"]]
    assert len(points) == got["requests"] == got["http_req_duration"]["count"]
    assert got["http_req_duration"]["p95"] == pytest.approx(percentile(points, 95))
    assert got["http_req_duration"]["max"] == max(points)
    # and gate reads the merged result like any other bench.k6 result
    assert cli("gate", merged).returncode == 0


def test_merge_refuses_an_incomplete_or_mixed_set_of_segments(runs, cli):
    segs, plain = runs["2"], runs["whole"]
    proc = cli("bench", "merge", segs[0])
    assert proc.returncode == 2 and "segments 2/2 missing" in proc.stderr
    proc = cli("bench", "merge", segs[0], segs[0])
    assert proc.returncode == 2 and "given twice" in proc.stderr
    proc = cli("bench", "merge", plain, segs[1])
    assert proc.returncode == 2 and "not a segment" in proc.stderr


def test_k8s_writes_a_testrun_that_runs_zgtools_script_on_n_pods(cli, tmp_path: Path):
    yaml = pytest.importorskip("yaml")
    cfg = tmp_path / "zgtool.toml"
    cfg.write_text('[targets.engine]\nurl = "http://vllm.svc:8000"\napi = "openai"\nkey_env = "ZG_TEST_KEY"\n')
    out = tmp_path / "k8s"
    proc = cli("bench", "--config", cfg, "--direct", "engine", "--scenarios", "direct", "--api", "openai",
               "--rate", "200", "--duration", "2m", "--k8s", "4", "--k8s-out", out,
               env={"ZG_TEST_KEY": "sk-secret-123"})
    assert proc.returncode == 0, proc.stderr
    run = yaml.safe_load((out / "k6-testrun.yaml").read_text())
    cm = yaml.safe_load((out / "k6-configmap.yaml").read_text())
    secret = yaml.safe_load((out / "k6-secret.yaml").read_text())
    assert run["apiVersion"] == "k6.io/v1alpha1" and run["kind"] == "TestRun"
    assert run["spec"]["parallelism"] == 4
    assert run["spec"]["script"]["configMap"] == {"name": cm["metadata"]["name"], "file": "gateway_vs_direct.js"}
    assert cm["data"]["gateway_vs_direct.js"] == (ROOT / "k6" / "gateway_vs_direct.js").read_text()
    assert json.loads(cm["data"]["payload.json"]) == json.loads((ROOT / "k6/payloads/chat_completions.json").read_text())
    env = {e["name"]: e.get("value", e.get("valueFrom")) for e in run["spec"]["runner"]["env"]}
    assert env["DIRECT_URL"] == "http://vllm.svc:8000" and env["RATE"] == "200" and env["DURATION"] == "120s"
    assert env["ENDPOINT"] == "/v1/chat/completions" and env["PAYLOAD"] == "payload.json"
    assert env["DIRECT_HEADERS"] == {"secretKeyRef": {"name": secret["metadata"]["name"], "key": "DIRECT_HEADERS"}}
    assert "sk-secret-123" in secret["stringData"]["DIRECT_HEADERS"]
    assert "sk-secret-123" not in (out / "k6-testrun.yaml").read_text()


def test_a_bench_whose_every_request_failed_does_not_exit_0(asgi_url, cli, tmp_path: Path):
    payload = tmp_path / "fail.json"
    payload.write_text(json.dumps({"model": "default", "max_tokens": 4,
                                   "messages": [{"role": "user", "content": "fail-me"}]}))
    out, scratch = tmp_path / "b.json", tmp_path / "tmp"
    scratch.mkdir()
    proc = cli("bench", "--direct", asgi_url, "--scenarios", "direct", "--rate", "5", "--duration", "1s",
               "--payload", payload, "--no-progress", "-o", out, env={"TMPDIR": str(scratch)})
    assert proc.returncode == 5, proc.stderr
    assert "all" in proc.stderr and "requests failed" in proc.stderr
    data = json.loads(out.read_text())["data"]
    assert data["failures"] >= 5  # the result is still written
    # without --run-dir the run's folder is kept for a failed run, and the message names its log
    (kept,) = scratch.glob("zgtool-bench-*")
    assert (kept / "k6.log").exists() and str(kept / "k6.log") in " ".join(proc.stderr.split())
    assert data["config"]["run_dir"] == str(kept)


def test_a_bench_without_run_dir_leaves_no_folder_behind(asgi_url, cli, tmp_path: Path):
    out, scratch = tmp_path / "b.json", tmp_path / "tmp"
    scratch.mkdir()
    proc = cli("bench", "--direct", asgi_url, "--scenarios", "direct", "--rate", "5", "--duration", "1s",
               "--no-progress", "-o", out, env={"TMPDIR": str(scratch)})
    assert proc.returncode == 0, proc.stderr
    assert list(scratch.iterdir()) == []                      # k6's log, summary and points went with the run
    data = json.loads(out.read_text())["data"]
    assert data["requests"] >= 5 and data["config"]["run_dir"] is None    # it names no folder that is gone



def test_merged_segments_sum_their_reconnects_and_take_the_p50_interval_from_the_pooled_points():
    """Each segment says its own reconnects; the merged result says the sum once, and its p50 difference
    is computed over every segment's points, not one segment's."""
    from dataclasses import asdict

    from zgtool.loadtest.differences import RECONNECT_MARK, reconnect_notes
    from zgtool.loadtest.merge import merge_segments, trend_of
    from zgtool.loadtest.points import ROUND_KEY
    from zgtool.loadtest.summary import PHASES, ScenarioStats

    def segment(i: int, shift_ms: float, reconnects: int) -> dict:
        pts = {"direct": [10.0 + 0.1 * k + i for k in range(20)]}
        pts["gateway"] = [v + shift_ms for v in pts["direct"]]
        scen = {name: ScenarioStats(name=name, url="http://x", stream=False, rate_rps=10, requests=20, failures=0,
                                    failure_rate=0.0, achieved_rps=10.0, dropped_iterations=0, checks_failed=0,
                                    reconnects=reconnects if name == "gateway" else 0,
                                    **{ph: trend_of(v) for ph in PHASES})
                for name, v in pts.items()}
        notes = reconnect_notes(scen)
        assert len(notes) == 1 and f"gateway: {reconnects} of 20" in notes[0]
        return {"kind": "bench.k6", "data": {
            "segment": f"{i}/2", "k6_version": "v1.1.0", "script": "gateway_vs_direct.js", "test_run_s": 2.0,
            "config": {"rate_rps": 10, "duration_s": 2.0, "api": "anthropic", "arrivals": "constant",
                       "sequential": True, "endpoint": "/v1/messages"},
            "scenarios": {n: asdict(s) for n, s in scen.items()}, "notes": notes,
            "points": {n: {"http_req_duration": v, ROUND_KEY: [float(k % 4) for k in range(len(v))]}
                       for n, v in pts.items()}}}

    merged = merge_segments([("a.json", segment(1, 3.0, 4)), ("b.json", segment(2, 3.0, 5))])
    assert merged.scenarios["gateway"].reconnects == 9 and merged.scenarios["direct"].reconnects == 0
    said = [n for n in merged.notes if RECONNECT_MARK in n]
    assert len(said) == 1 and said[0].startswith("gateway: 9 of 40 requests"), merged.notes
    d = merged.differences["gateway"]
    assert d["n"] == 40 and d["p50_ms"] == pytest.approx(3.0) and d["lo_ms"] > 0
    assert d["rounds"] == 4 and d["method"].startswith("paired by rounds")   # the segments' turns, pooled


def test_reconnects_in_several_scenarios_are_said_once_with_each_count_and_connect_time():
    """vLLM behind LiteLLM at 2 req/s, 10 turns: 10 of 40 requests of every scenario reconnected; the note said
    the same cause three times over (18 lines at 80 columns). One line names each scenario's count."""
    from zgtool.loadtest.differences import RECONNECT_MARK, reconnect_notes
    from zgtool.loadtest.merge import trend_of
    from zgtool.loadtest.summary import PHASES, ScenarioStats

    def stats(name: str, reconnects: int, connect_ms: float) -> ScenarioStats:
        trends = {ph: trend_of([connect_ms] * 4 if ph == "http_req_connecting" else [10.0] * 4) for ph in PHASES}
        return ScenarioStats(name=name, url="http://x", stream=False, rate_rps=2, requests=40, failures=0,
                             failure_rate=0.0, achieved_rps=2.0, dropped_iterations=0, checks_failed=0,
                             reconnects=reconnects, **trends)

    scen = {"gateway": stats("gateway", 10, 0.9), "direct": stats("direct", 0, 0.0),
            "direct_stream": stats("direct_stream", 7, 0.57)}
    (note,) = reconnect_notes(scen)
    assert note.startswith(f"gateway: 10 of 40, direct_stream: 7 of 40 requests {RECONNECT_MARK}"), note
    assert "connecting p95 0.90, 0.57 ms" in note and "direct:" not in note
    assert reconnect_notes({"direct": stats("direct", 0, 0.0)}) == []

"""latency-split's outputs beside the JSON: the live progress line (on a terminal only, off with --quiet),
the --csv tables, and the OTel GenAI client metrics pushed to a real OTLP/HTTP receiver."""

from __future__ import annotations

import csv
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from otlp_metrics_receiver import MetricsReceiver
from otlp_metrics_receiver import attrs as _attrs
from pty_run import run_on_a_terminal as _run_on_a_terminal
from zgtest import run_zgtool

from zgtool.errors import ExitCode

FAST = ["--max-tokens", "4", "--warmup", "0", "--rounds", "2"]


def test_a_terminal_sees_one_progress_line_rewritten_in_place(origin: str) -> None:
    rc, term = _run_on_a_terminal("latency-split", origin, "-n", "6", *FAST)
    assert rc == 0, term
    assert "\rlatency-split  " in term and "/6 requests" in term and "req/s" in term and "0 errors" in term
    assert "6/6 requests" in term       # the last count is drawn before the line ends


def test_an_open_loop_run_counts_each_request_too(origin: str) -> None:
    rc, term = _run_on_a_terminal("latency-split", origin, "-n", "6", "--rate", "200", *FAST)
    assert rc in (0, 5), term          # 5: a busy machine's client fell behind the schedule
    assert "6/6 requests" in term and "req/s" in term


def test_quiet_or_a_pipe_shows_no_progress_line(origin: str) -> None:
    rc, term = _run_on_a_terminal("latency-split", origin, "-n", "4", "--quiet", *FAST)
    assert rc == 0, term
    assert "req/s" not in term and "requests  " not in term
    r = run_zgtool("latency-split", origin, "-n", "4", *FAST, env={"ZGTOOL_PROGRESS_AFTER_S": "0"})
    assert r.returncode == 0, r.stderr
    assert "req/s" not in r.stderr and "\r" not in r.stderr


def _rows(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


def test_csv_holds_every_request_and_every_summary_table(origin: str, gateway: str, tmp_path: Path) -> None:
    out, csv_dir = tmp_path / "split.json", tmp_path / "csv"
    r = run_zgtool("latency-split", origin, gateway, "-n", "5", *FAST, "-o", out, "--csv", csv_dir)
    assert r.returncode == 0, r.stderr
    data = json.loads(out.read_text())["data"]
    samples = _rows(csv_dir / "samples.csv")
    assert len(samples) == 10 and {s["target"] for s in samples} == {t["name"] for t in data["targets"]}
    first = data["targets"][0]["samples"][0]
    row = next(s for s in samples if s["target"] == data["targets"][0]["name"] and s["index"] == "0")
    assert float(row["total_ms"]) == pytest.approx(first["total_ms"])
    assert row["itl_ms"].count(";") == len(first["itl_ms"]) - 1
    assert "server_timing.prefill_ms" in row and "engine.prefill_ms" in row      # nested, unit kept
    phases = _rows(csv_dir / "phases.csv")
    total = next(p for p in phases if p["target"] == data["targets"][0]["name"] and p["phase"] == "total_ms")
    assert float(total["p50_ms"]) == pytest.approx(data["targets"][0]["phases"]["total_ms"]["summary"]["p50"])
    assert {"median_lo_ms", "median_hi_ms", "p99_ms"} <= set(total)
    diffs = _rows(csv_dir / "differences.csv")
    assert len(diffs) == len(data["differences"]) and {"diff_ms", "lo_ms", "hi_ms", "verdict"} <= set(diffs[0])
    targets = _rows(csv_dir / "targets.csv")
    assert [t["target"] for t in targets] == [t["name"] for t in data["targets"]]
    assert "throughput.request_rps" in targets[0]


def test_csv_into_a_file_is_refused_before_anything_is_sent(origin: str, tmp_path: Path) -> None:
    f = tmp_path / "afile"
    f.write_text("x")
    r = run_zgtool("latency-split", origin, "-n", "2", *FAST, "--csv", f)
    assert r.returncode == ExitCode.USAGE and "--csv" in r.stderr and r.stderr.count("\n") == 1


@pytest.fixture
def receiver() -> Iterator[MetricsReceiver]:
    pytest.importorskip("opentelemetry.proto", reason="the test extra opentelemetry-proto decodes the export")
    r = MetricsReceiver()
    yield r
    r.close()


def test_otlp_export_carries_the_genai_client_metrics_per_path(origin: str, gateway: str,
                                                               receiver: MetricsReceiver) -> None:
    from zgtool.otel_metrics import DURATION_BUCKETS_S, TOKEN_BUCKETS

    r = run_zgtool("latency-split", origin, gateway, "-n", "5", *FAST, "--otlp-endpoint", receiver.url,
                   "-o", "/dev/null")
    assert r.returncode == 0, r.stderr
    assert receiver.content_types == ["application/x-protobuf"] and len(receiver.requests) == 1
    metrics = {m.name: m for rm in receiver.requests[0].resource_metrics for sm in rm.scope_metrics
               for m in sm.metrics}
    assert set(metrics) == {"gen_ai.client.operation.duration", "gen_ai.client.operation.time_to_first_chunk",
                            "gen_ai.client.operation.time_per_output_chunk", "gen_ai.client.token.usage"}
    assert {n: m.unit for n, m in metrics.items()}["gen_ai.client.token.usage"] == "{token}"
    assert all(m.unit == "s" for n, m in metrics.items() if n != "gen_ai.client.token.usage")
    duration = metrics["gen_ai.client.operation.duration"].histogram
    assert duration.aggregation_temporality == 2          # cumulative
    by_path = {_attrs(p)["zgtool.path"]: p for p in duration.data_points}
    assert set(by_path) == {origin, gateway}
    for path, p in by_path.items():
        assert p.count == 5 and sum(p.bucket_counts) == 5
        assert tuple(p.explicit_bounds) == DURATION_BUCKETS_S
        a = _attrs(p)
        assert a["gen_ai.operation.name"] == "chat" and a["gen_ai.provider.name"] == "anthropic"
        assert a["server.address"] == "127.0.0.1" and a["server.port"] == int(path.rsplit(":", 1)[1])
        assert "error.type" not in a and a["gen_ai.request.model"]
    ttfc = metrics["gen_ai.client.operation.time_to_first_chunk"].histogram.data_points
    assert sorted(p.count for p in ttfc) == [5, 5]
    tokens = metrics["gen_ai.client.token.usage"].histogram.data_points
    assert {(_attrs(p)["zgtool.path"], _attrs(p)["gen_ai.token.type"]) for p in tokens} == \
        {(u, t) for u in (origin, gateway) for t in ("input", "output")}
    assert all(tuple(p.explicit_bounds) == TOKEN_BUCKETS and p.count == 5 for p in tokens)
    out_tok = next(p for p in tokens if _attrs(p)["gen_ai.token.type"] == "output")
    assert out_tok.sum == 5 * 4                                             # --max-tokens 4, five requests


def test_failed_requests_are_exported_with_their_error_type(flaky_origin: str, receiver: MetricsReceiver) -> None:
    r = run_zgtool("latency-split", flaky_origin, "-n", "6", *FAST, "--api", "anthropic", "--model", "m",
                   "--otlp-endpoint", receiver.url + "/v1/metrics", "-o", "/dev/null")
    assert r.returncode == 0, r.stderr
    duration = next(m for rm in receiver.requests[0].resource_metrics for sm in rm.scope_metrics
                    for m in sm.metrics if m.name == "gen_ai.client.operation.duration")
    by_error = {_attrs(p).get("error.type"): p.count for p in duration.histogram.data_points}
    assert by_error.get(None) and sum(by_error.values()) == 6
    assert any(e and "529" in str(e) for e in by_error)        # the failed ones, named by their error


def test_a_bad_otlp_endpoint_is_refused_before_anything_is_sent(origin: str) -> None:
    r = run_zgtool("latency-split", origin, "-n", "2", *FAST, "--otlp-endpoint", "localhost:4318")
    assert r.returncode == ExitCode.USAGE and "--otlp-endpoint" in r.stderr and r.stderr.count("\n") == 1

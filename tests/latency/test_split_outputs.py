"""latency-split's outputs beside the JSON: the live progress line (on a terminal only, off with --quiet),
the --csv tables, and the OTel GenAI client metrics pushed to a real OTLP/HTTP receiver."""

from __future__ import annotations

import csv
import json
import os
import pty
import select
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from zgtest import run_zgtool

from zgtool.errors import ExitCode

FAST = ["--max-tokens", "4", "--warmup", "0", "--rounds", "2"]


def _run_on_a_terminal(*args: str) -> tuple[int, str]:
    """`zgtool ARGS` with stderr on a pseudo-terminal (stdout a pipe); returns (exit code, what the terminal got)."""
    master, slave = pty.openpty()
    env = {**os.environ, "ZGTOOL_PROGRESS_AFTER_S": "0", "COLUMNS": "200", "NO_COLOR": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "zgtool", *args], stdout=subprocess.PIPE, stderr=slave,
                            stdin=subprocess.DEVNULL, env=env)
    os.close(slave)
    got = bytearray()
    try:
        while True:
            ready, _, _ = select.select([master], [], [], 60)
            if not ready:
                break
            try:
                chunk = os.read(master, 65536)
            except OSError:   # EIO: the child closed the terminal
                break
            if not chunk:
                break
            got += chunk
        assert proc.stdout is not None
        proc.stdout.read()
        return proc.wait(timeout=60), got.decode(errors="replace")
    finally:
        os.close(master)
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_a_terminal_sees_one_progress_line_rewritten_in_place(origin: str) -> None:
    rc, term = _run_on_a_terminal("latency-split", origin, "-n", "6", *FAST)
    assert rc == 0, term
    assert "\rlatency-split  " in term and "/6 requests" in term and "req/s" in term and "0 errors" in term
    assert "6/6 requests" in term       # the last count is drawn before the line ends


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


class _Receiver:
    """A real OTLP/HTTP metrics endpoint: POST /v1/metrics bodies decoded with the official classes."""

    def __init__(self) -> None:
        from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest

        self.requests: list[ExportMetricsServiceRequest] = []
        self.content_types: list[str] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                body = self.rfile.read(int(self.headers["Content-Length"]))
                if self.path != "/v1/metrics":
                    self.send_response(404)
                    self.end_headers()
                    return
                outer.content_types.append(self.headers["Content-Type"])
                outer.requests.append(ExportMetricsServiceRequest.FromString(body))
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver() -> Iterator[_Receiver]:
    pytest.importorskip("opentelemetry.proto", reason="the test extra opentelemetry-proto decodes the export")
    r = _Receiver()
    yield r
    r.close()


def _attrs(point: object) -> dict[str, object]:
    out = {}
    for kv in point.attributes:  # type: ignore[attr-defined]
        v = kv.value
        out[kv.key] = v.int_value if v.HasField("int_value") else v.string_value
    return out


def test_otlp_export_carries_the_genai_client_metrics_per_path(origin: str, gateway: str,
                                                               receiver: _Receiver) -> None:
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


def test_failed_requests_are_exported_with_their_error_type(flaky_origin: str, receiver: _Receiver) -> None:
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

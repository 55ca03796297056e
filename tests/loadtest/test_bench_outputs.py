"""bench's outputs beside the JSON: --csv tables, gen_ai.client.operation.duration of every k6 request over
OTLP/HTTP (a real receiver decoding with the official classes), and a progress bar only on a terminal
without --quiet."""

from __future__ import annotations

import csv
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from otlp_metrics_receiver import MetricsReceiver, attrs
from pty_run import run_on_a_terminal

from zgtool.errors import ExitCode
from zgtool.loadtest.summary import PHASES

RUN = ["--scenarios", "direct", "--rate", "10", "--duration", "1s"]


@pytest.fixture
def receiver() -> Iterator[MetricsReceiver]:
    pytest.importorskip("opentelemetry.proto", reason="the test extra opentelemetry-proto decodes the export")
    r = MetricsReceiver()
    yield r
    r.close()


def _rows(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


def test_csv_and_otlp_carry_every_request_of_the_run(asgi_url, cli, receiver: MetricsReceiver, tmp_path: Path):
    from zgtool.otel_metrics import DURATION_BUCKETS_S

    out, csv_dir = tmp_path / "bench.json", tmp_path / "csv"
    proc = cli("bench", "--direct", asgi_url, *RUN, "--quiet", "-o", out, "--csv", csv_dir,
               "--otlp-endpoint", receiver.url)
    assert proc.returncode == 0, proc.stderr
    data = json.loads(out.read_text())["data"]
    n = data["scenarios"]["direct"]["requests"]
    scenarios = _rows(csv_dir / "bench_scenarios.csv")
    assert [(r["scenario"], int(r["requests"])) for r in scenarios] == [("direct", n)]
    assert {"rate_rps", "achieved_rps", "failure_rate"} <= set(scenarios[0])
    phases = _rows(csv_dir / "bench_phases.csv")
    assert {r["metric"] for r in phases} == set(PHASES)
    duration = next(r for r in phases if r["metric"] == "http_req_duration")
    assert int(duration["count"]) == n and float(duration["p95_ms"]) == \
        pytest.approx(data["scenarios"]["direct"]["http_req_duration"]["p95"])
    points = receiver.metrics()["gen_ai.client.operation.duration"].histogram.data_points
    assert [attrs(p)["zgtool.path"] for p in points] == ["direct"]
    assert points[0].count == n and tuple(points[0].explicit_bounds) == DURATION_BUCKETS_S
    assert attrs(points[0])["gen_ai.operation.name"] == "chat"


def test_failed_k6_requests_are_exported_with_their_status(asgi_url, cli, receiver: MetricsReceiver,
                                                           tmp_path: Path):
    payload = tmp_path / "fail.json"
    payload.write_text(json.dumps({"model": "default", "max_tokens": 4,
                                   "messages": [{"role": "user", "content": "fail-me"}]}))
    proc = cli("bench", "--direct", asgi_url, *RUN, "--quiet", "--payload", payload,
               "--otlp-endpoint", receiver.url)
    assert proc.returncode != 0     # every request failed: never exit 0
    points = receiver.metrics()["gen_ai.client.operation.duration"].histogram.data_points
    assert {attrs(p).get("error.type") for p in points} == {"500"}


def test_bad_csv_or_otlp_options_are_refused_before_k6_starts(asgi_url, cli, tmp_path: Path):
    f = tmp_path / "afile"
    f.write_text("x")
    for extra in (["--csv", f], ["--otlp-endpoint", "nope"]):
        proc = cli("bench", "--direct", asgi_url, *RUN, *extra)
        assert proc.returncode == ExitCode.USAGE and proc.stderr.count("\n") == 1, proc.stderr


def test_the_progress_bar_shows_on_a_terminal_and_not_with_quiet(asgi_url):
    rc, term = run_on_a_terminal("bench", "--direct", asgi_url, *RUN)
    assert rc == 0, term
    assert "k6 direct" in term
    rc, term = run_on_a_terminal("bench", "--direct", asgi_url, *RUN, "--quiet")
    assert rc == 0, term
    assert "k6 direct" not in term

"""Fixtures for gate tests: result files written with the real result schema."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
from zgtest import run_zgtool

from zgtool.results import make_result, write_result


def phases(p95: float, blocked_p95: float = 0.05) -> dict[str, Any]:
    def trend(p: float) -> dict[str, float]:
        return {"unit": "ms", "avg": p * 0.7, "min": p * 0.3, "p50": p * 0.6, "p90": p * 0.9,
                "p95": p, "p99": p * 1.2, "max": p * 1.5, "count": 100}
    return {
        "requests": 100, "failures": 0, "failure_rate": 0.0, "dropped_iterations": 0,
        "http_req_blocked": trend(blocked_p95), "http_req_connecting": trend(0.02),
        "http_req_tls_handshaking": trend(0.0), "http_req_sending": trend(0.03),
        "http_req_waiting": trend(p95 * 0.9), "http_req_receiving": trend(0.05),
        "http_req_duration": trend(p95),
    }


def make_k6_data(direct_p95: float = 5.0, gateway_p95: float = 10.0, failures: int = 0) -> dict[str, Any]:
    return {
        "requests": 300, "failures": failures, "failure_rate": failures / 300, "dropped_iterations": 0,
        "scenarios": {"direct": phases(direct_p95), "gateway": phases(gateway_p95),
                      "direct_stream": phases(direct_p95 * 1.1)},
    }


@pytest.fixture
def write(tmp_path: Path):
    """write(name, kind, data) -> path of a real zgtool result file."""
    def _write(name: str, kind: str, data: dict[str, Any]) -> Path:
        return write_result(make_result(kind, data, command="test"), tmp_path / name)
    return _write


@pytest.fixture
def policy_file(tmp_path: Path):
    def _policy(text: str) -> Path:
        p = tmp_path / "gates.toml"
        p.write_text(text)
        return p
    return _policy


def run_cli(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return run_zgtool(*args, timeout_s=60, columns=240)  # a wide table: rows are asserted on one line


@pytest.fixture
def k6_data():
    """k6_data(direct_p95=, gateway_p95=, failures=) -> data shaped like a bench.k6 result."""
    return make_k6_data


@pytest.fixture
def cli():
    """cli(*args) -> CompletedProcess of `zgtool ARGS` in a fresh interpreter (real exit codes)."""
    return run_cli

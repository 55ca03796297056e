"""The README's exit-code table, code by code: each documented code is what a real run that should give it
exits with, and every code in the table has a case here (a new row without a test fails)."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from zgtest import run_zgtool, silent_listener

from zgtool.errors import ExitCode
from zgtool.http.net import free_port
from zgtool.results import make_result, write_result

README = Path(__file__).resolve().parents[2] / "README.md"


def documented_codes() -> set[int]:
    text = README.read_text()
    table = text[text.index("| exit | meaning |"):]
    return {int(m) for m in re.findall(r"(?m)^\| (\d+) \|", table.split("\n\n")[0])}


def _split(name: str, ok: int, failed: int) -> dict:
    samples = [{"index": i, "round": i % 4, "ok": i < ok, "total_ms": 10.0 + i % 3 if i < ok else None,
                "ttft_ms": None} for i in range(ok + failed)]
    return {"name": name, "samples": samples, "num_ok": ok, "num_error": failed}


def _result(tmp: Path, kind: str, data: dict) -> Path:
    return write_result(make_result(kind, data, command="test"), tmp / f"{kind}.json")


@pytest.fixture
def silent_port() -> Iterator[int]:
    """A listening socket that never answers."""
    with silent_listener(8) as port:
        yield port


def case_ok(tmp: Path, _port: int) -> list[str]:
    data = {"config": {}, "definitions": {"total_ms": "."}, "targets": [_split("a", 20, 0)]}
    return ["gate", str(_result(tmp, "latency_split", data))]


def case_failed(tmp: Path, _port: int) -> list[str]:
    data = {"config": {}, "definitions": {"total_ms": "."}, "targets": [_split("a", 18, 2)]}  # 10% failed
    return ["gate", str(_result(tmp, "latency_split", data))]


def case_usage(tmp: Path, _port: int) -> list[str]:
    return ["latency-split", "127.0.0.1:1"]          # no scheme: "did you mean http://...?"


def case_unreachable(tmp: Path, port: int) -> list[str]:
    return ["latency-split", f"http://127.0.0.1:{port}", "--timeout-s", "1", "-n", "2"]


def case_missing_capability(tmp: Path, _port: int) -> list[str]:
    return ["dcgm", "watch", "--nvml"]              # no NVIDIA driver on a CPU-only test machine


def case_unreliable(tmp: Path, _port: int) -> list[str]:
    data = {"config": {}, "definitions": {"total_ms": "."}, "targets": [_split("a", 0, 20)]}
    return ["gate", str(_result(tmp, "latency_split", data))]


CASES: dict[int, Callable[[Path, int], list[str]]] = {
    ExitCode.OK: case_ok, ExitCode.VERDICT_FAILED: case_failed, ExitCode.USAGE: case_usage,
    ExitCode.UNREACHABLE: case_unreachable, ExitCode.MISSING_CAPABILITY: case_missing_capability,
    ExitCode.UNRELIABLE: case_unreliable,
}
# 130 (Ctrl-C) has its own tests, one per long-running command: tests/cli/test_cli_interrupt.py
ELSEWHERE = {int(ExitCode.INTERRUPTED)}


def test_every_documented_exit_code_has_a_case() -> None:
    assert documented_codes() == {int(c) for c in CASES} | ELSEWHERE


@pytest.mark.parametrize("code", sorted(CASES), ids=lambda c: f"exit-{int(c)}")
def test_the_documented_exit_code_is_what_the_run_exits_with(code: ExitCode, tmp_path: Path, silent_port: int) -> None:
    if code == ExitCode.MISSING_CAPABILITY:
        try:
            import pynvml  # noqa: F401

            pynvml.nvmlInit()
            pytest.skip("an NVIDIA driver is present: NVML is not missing here")
        except Exception:  # noqa: BLE001 - any NVML failure means the capability is missing, as wanted
            pass
    args = CASES[code](tmp_path, silent_port)
    r = run_zgtool(*args, timeout_s=60)
    assert r.returncode == code, f"zgtool {' '.join(args)} -> {r.returncode}\n{r.stdout}\n{r.stderr}"
    assert "Traceback" not in r.stderr


def test_a_closed_port_is_unreachable_too() -> None:
    r = run_zgtool("latency-split", f"http://127.0.0.1:{free_port()}", "-n", "2", timeout_s=60)
    assert r.returncode == ExitCode.UNREACHABLE, r.stderr

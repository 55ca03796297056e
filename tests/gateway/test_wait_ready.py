"""wait_ready watches the child while a readiness probe is out: a gateway that exits while its probe
waits on another process's silent listener is reported as exited then, not after the probe's timeout."""

from __future__ import annotations

import sys
import threading
from pathlib import Path

from zgtool.gateway.procs import Child, wait_ready


def _child(tmp_path: Path, code: str) -> Child:
    child = Child("gw", [sys.executable, "-c", code], tmp_path / "gw.log")
    child.start()
    return child


def test_a_child_that_exits_while_its_probe_hangs_is_reported_before_the_probe_returns(tmp_path: Path) -> None:
    release = threading.Event()
    finished = threading.Event()

    def hanging_probe() -> bool:     # a GET to a listener that accepts and never answers
        release.wait(60)
        finished.set()
        return False

    child = _child(tmp_path, "import sys; sys.exit(3)")
    try:
        why = wait_ready(child, hanging_probe, timeout_s=60)
        assert why == "exited with code 3"
        assert not finished.is_set()     # it did not wait for the probe
    finally:
        release.set()
        child.stop(1.0)


def test_a_probe_that_answers_makes_the_child_ready_and_errors_count_as_not_yet(tmp_path: Path) -> None:
    calls: list[int] = []

    def flaky_probe() -> bool:
        calls.append(1)
        if len(calls) < 3:
            raise ConnectionRefusedError("not listening yet")
        return True

    child = _child(tmp_path, "import time; time.sleep(60)")
    try:
        assert wait_ready(child, flaky_probe, timeout_s=60, interval_s=0.01) is None
        assert len(calls) == 3
    finally:
        child.stop(1.0)


def test_a_probe_that_never_answers_times_out_with_the_child_alive(tmp_path: Path) -> None:
    child = _child(tmp_path, "import time; time.sleep(60)")
    try:
        assert wait_ready(child, lambda: False, timeout_s=0.2, interval_s=0.01) == "not ready after 0.2 s"
        assert child.is_alive()
    finally:
        child.stop(1.0)

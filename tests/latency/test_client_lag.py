"""The instrumented client's receive times when it reads late, against the server's own send
times (both on CLOCK_MONOTONIC). The client is stopped (SIGSTOP) while it waits in recv, the way a
busy host can leave a woken virtual CPU unscheduled: its run-queue wait then shows nothing.

One segment read late still carries its own arrival time. Two segments read late carry the
second's, so the client must report the gap as lag (not vouch for the first byte's time)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from zgtool.latency.transport import LAG_FLAG_NS

CLIENT = Path(__file__).with_name("lag_client.py")
GAP_NS = 30_000_000           # the server's pause between its two sends: the scenario, not a wait
TOLERANCE_NS = 200_000        # the split's tolerance for a phase on loopback


def _state(pid: int) -> str:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0]


def _wait_state(pid: int, states: str, what: str) -> None:
    deadline = time.monotonic() + 30
    while _state(pid) not in states:
        assert time.monotonic() < deadline, f"client never got {what}"
        time.sleep(0.001)


@pytest.fixture
def listener() -> Iterator[socket.socket]:
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen()
    yield srv
    srv.close()


def _run(listener: socket.socket, sends: int) -> tuple[dict, list[int]]:
    port = listener.getsockname()[1]
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])}
    proc = subprocess.Popen([sys.executable, str(CLIENT), str(port)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)
    sent: list[int] = []
    try:
        listener.settimeout(60)
        conn, _ = listener.accept()
        with conn:
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            buf = b""
            while not buf.endswith(b"\r\n\r\n"):
                chunk = conn.recv(4096)
                assert chunk, "client closed before its request"
                buf += chunk
            _wait_state(proc.pid, "S", "to wait in recv")
            os.kill(proc.pid, signal.SIGSTOP)
            _wait_state(proc.pid, "tT", "stopped")
            for i in range(sends):
                if i:
                    while time.perf_counter_ns() < sent[-1] + GAP_NS:
                        pass
                sent.append(time.perf_counter_ns())
                conn.sendall(f"segment {i}\n".encode())
            os.kill(proc.pid, signal.SIGCONT)
            out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGCONT)
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err
    return json.loads(out), sent


def test_one_segment_read_late_keeps_its_arrival_time(listener: socket.socket) -> None:
    marks, (t_sent,) = _run(listener, sends=1)
    assert abs(marks["first_read_ns"] - t_sent) < TOLERANCE_NS, marks


def test_two_segments_read_late_are_reported_as_lag_back_to_the_first(listener: socket.socket) -> None:
    """The kernel gives one read one time, the latest segment's: the first byte came GAP_NS
    earlier, and the client must say its first read is not vouched for by at least that much."""
    marks, (t_first, t_second) = _run(listener, sends=2)
    assert marks["bytes"] == len(b"segment 0\nsegment 1\n"), marks
    assert marks["first_read_ns"] >= t_second, "the read's time is the second segment's"
    assert marks["first_lag_ns"] > LAG_FLAG_NS, marks
    assert marks["first_read_ns"] - marks["first_lag_ns"] <= t_first + TOLERANCE_NS, (marks, t_first)

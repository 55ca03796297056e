"""The instrumented client's receive times when it reads late, against the server's own send
times (both on CLOCK_MONOTONIC). The client is stopped (SIGSTOP) while it waits in recv, the way a
busy host can leave a woken virtual CPU unscheduled: its run-queue wait then shows nothing.

One segment read late still carries its own arrival time. Two segments read late carry the
second's, so the client must report the gap as lag (not vouch for the first byte's time). In a whole
latency-split stream request: a late read that merged pieces is flagged when a figure's point lies before
its last byte, every time, and vouched for when the point ends that read (its time is the read's own)."""

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
from sse_script_server import HEAD, TAIL_OA, chunk, oa

from zgtool.latency.wire.transport import LAG_FLAG_NS

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


# --- a whole stream request, read late on purpose ---------------------------------------------------

PIECE_GAP_NS = 2_000_000      # between two pieces written while the client is stopped


def _rx_queue(client_port: int, server_port: int) -> int | None:
    """Bytes the client has not read yet on its socket (/proc/net/tcp rx_queue)."""
    want = (f":{client_port:04X}", f":{server_port:04X}")
    with open("/proc/net/tcp") as f:
        for line in f.readlines()[1:]:
            cols = line.split()
            if cols[1].endswith(want[0]) and cols[2].endswith(want[1]):
                return int(cols[4].split(":")[1], 16)
    return None


class StreamScene:
    """The test is the server: it writes the answer piece by piece and stops/continues the client."""

    def __init__(self, listener: socket.socket) -> None:
        port = listener.getsockname()[1]
        env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])}
        self.proc = subprocess.Popen([sys.executable, str(CLIENT), str(port), "measure"], stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True, env=env)
        listener.settimeout(60)
        self.conn, peer = listener.accept()
        self.conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.ports = (peer[1], port)
        buf = b""
        while b"\r\n\r\n" not in buf:
            chunk_ = self.conn.recv(65536)
            assert chunk_, "client closed before its request"
            buf += chunk_
        head, _, body = buf.partition(b"\r\n\r\n")
        length = int(next(v for k, _, v in (ln.partition(b":") for ln in head.split(b"\r\n"))
                          if k.strip().lower() == b"content-length"))
        while len(body) < length:
            body += self.conn.recv(65536)
        self.sent: list[int] = []

    def send(self, piece: bytes) -> int:
        if self.sent:
            while time.perf_counter_ns() < self.sent[-1] + PIECE_GAP_NS:
                pass          # the scenario's pacing
        self.sent.append(time.perf_counter_ns())
        self.conn.sendall(piece)
        return self.sent[-1]

    def consumed(self) -> None:
        """Wait until the client has read everything sent and waits in recv again."""
        deadline = time.monotonic() + 30
        while _rx_queue(*self.ports) != 0 or _state(self.proc.pid) != "S":
            assert time.monotonic() < deadline, "client never read what was sent"
            time.sleep(0.001)

    def stop(self) -> None:
        _wait_state(self.proc.pid, "S", "to wait in recv")
        os.kill(self.proc.pid, signal.SIGSTOP)
        _wait_state(self.proc.pid, "tT", "stopped")

    def cont(self) -> None:
        os.kill(self.proc.pid, signal.SIGCONT)

    def finish(self) -> dict:
        for piece in TAIL_OA:
            self.send(chunk(piece))
        self.send(b"0\r\n\r\n")
        out, err = self.proc.communicate(timeout=60)
        self.conn.close()
        assert self.proc.returncode == 0, err
        doc = json.loads(out)
        assert doc["ok"], doc
        return doc

    def close(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGCONT)
            self.proc.kill()
            self.proc.wait()


@pytest.fixture
def scene(listener: socket.socket) -> Iterator[StreamScene]:
    s = StreamScene(listener)
    yield s
    s.close()


def test_a_late_read_that_ends_with_the_first_token_vouches_for_it(scene: StreamScene) -> None:
    """Head and the role-only delta in one piece, read at once; then, while the client is stopped, a
    keep-alive comment and 2 ms later the first token. The late read merges both, but the token ends
    it: its time is that read's own (the old rule flagged every merged read)."""
    scene.send(HEAD + chunk(oa({"role": "assistant", "content": ""})))
    scene.consumed()
    scene.stop()
    scene.send(chunk(b": keep-alive\n\n"))
    t_token = scene.send(chunk(oa({"content": "Hi"})))
    scene.cont()
    scene.consumed()
    doc = scene.finish()
    assert not doc["lagged"], doc
    assert doc["slack"][1] >= PIECE_GAP_NS - TOLERANCE_NS        # that read is late: it says so ...
    token_at = doc["t0_ns"] + doc["ttft_ms"] * 1e6                # ... yet the token is the read's own time
    assert t_token <= token_at < t_token + TOLERANCE_NS, (token_at - t_token, doc)
    assert doc["ttft_any_ms"] == doc["ttft_ms"]


def test_a_late_first_read_that_merged_the_head_with_the_body_is_flagged(scene: StreamScene) -> None:
    scene.stop()
    t_head = scene.send(HEAD)
    scene.send(chunk(oa({"role": "assistant", "content": ""})))
    scene.send(chunk(oa({"content": "Hi"})))
    scene.cont()
    scene.consumed()
    doc = scene.finish()
    assert doc["lagged"] and doc["client_lag_ms"] * 1e6 >= 2 * PIECE_GAP_NS - TOLERANCE_NS, doc
    first_read = doc["first_write_ns"] + doc["ttfb_ms"] * 1e6
    assert first_read - doc["client_lag_ms"] * 1e6 <= t_head + TOLERANCE_NS      # the bound holds the truth


def test_every_late_read_that_merged_pieces_says_so_and_no_other(scene: StreamScene) -> None:
    scene.send(HEAD)
    scene.consumed()
    scene.send(chunk(oa({"role": "assistant", "content": ""})))
    scene.consumed()
    for i in range(3):                  # three late reads of two pieces each, a timely read after each
        scene.stop()
        scene.send(chunk(oa({"content": f"a{i}"})))
        scene.send(chunk(oa({"content": f"b{i}"})))
        scene.cont()
        scene.consumed()
        scene.send(chunk(oa({"content": f"c{i}"})))
        scene.consumed()
    doc = scene.finish()
    late = doc["slack"][2:8:2]
    timely = [doc["slack"][0], doc["slack"][1], *doc["slack"][3:9:2]]
    assert all(x >= PIECE_GAP_NS - TOLERANCE_NS for x in late), doc["slack"]
    assert timely == [0] * len(timely), doc["slack"]

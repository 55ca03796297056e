"""Ctrl-C keeps the CLI's contract: every long-running command exits 130 with one line,
no traceback, and leaves no process behind.

Each command runs in its own session and gets SIGINT on its whole process group, as a
terminal's Ctrl-C would deliver it. Readiness is a state (an output line, an open port,
a k6 child), never a sleep.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from zgtest import wait_until

from zgtool.http.net import free_port

pytestmark = pytest.mark.slow


wait_for = wait_until


def tagged_pids(tag: str) -> list[int]:
    """Live processes whose environment carries this test's tag (the command and every descendant)."""
    needle = f"ZGTOOL_TEST_TAG={tag}".encode()
    pids = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            env = (d / "environ").read_bytes()
            state = (d / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if needle in env.split(b"\0") and state != "Z":
            pids.append(int(d.name))
    return pids


class Cli:
    """`python -m zgtool ARGS` in its own session, its output collected as it comes."""

    def __init__(self, *args: str, cwd: Path | None = None, env: dict[str, str] | None = None) -> None:
        self.tag = uuid.uuid4().hex
        env = {**os.environ, "ZGTOOL_TEST_TAG": self.tag, "COLUMNS": "100", "PYTHONUNBUFFERED": "1", **(env or {})}
        self.proc = subprocess.Popen([sys.executable, "-m", "zgtool", *args], stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, env=env, start_new_session=True, cwd=cwd)
        self.out: list[bytes] = []
        self.err: list[bytes] = []
        self._readers = [threading.Thread(target=self._pump, args=(s, b), daemon=True)
                         for s, b in ((self.proc.stdout, self.out), (self.proc.stderr, self.err))]
        for t in self._readers:
            t.start()

    @staticmethod
    def _pump(stream: object, into: list[bytes]) -> None:
        for chunk in iter(lambda: os.read(stream.fileno(), 65536), b""):  # type: ignore[attr-defined]
            into.append(chunk)

    @property
    def stdout(self) -> str:
        return b"".join(self.out).decode(errors="replace")

    @property
    def stderr(self) -> str:
        return b"".join(self.err).decode(errors="replace")

    def ctrl_c(self, timeout_s: float = 60.0) -> int:
        assert self.proc.poll() is None, f"exited early ({self.proc.returncode}): {self.stderr}"
        os.killpg(self.proc.pid, signal.SIGINT)
        rc = self.proc.wait(timeout=timeout_s)
        for t in self._readers:
            t.join(timeout=10)
        return rc

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)
        for pid in tagged_pids(self.tag):
            os.kill(pid, signal.SIGKILL)


def assert_interrupted_cleanly(cli: Cli, rc: int) -> None:
    err = cli.stderr
    assert rc == 130, f"rc={rc}\nstderr:\n{err}"
    assert "Traceback" not in err and "Error" not in err, err
    said = [ln for ln in err.splitlines() if "interrupt" in ln.lower()]
    assert said == ["zgtool: interrupted"], err
    wait_for(lambda: not tagged_pids(cli.tag), 10, "no process left behind")


@pytest.fixture
def cli_runs() -> Iterator[list[Cli]]:
    runs: list[Cli] = []
    yield runs
    for c in runs:
        c.kill()


def start(runs: list[Cli], *args: str, cwd: Path | None = None, env: dict[str, str] | None = None) -> Cli:
    c = Cli(*args, cwd=cwd, env=env)
    runs.append(c)
    return c


def healthy(url: str) -> bool:
    try:
        return httpx.get(f"{url}/health", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


def served(url: str) -> float:
    """Requests the engine finished, from its own /metrics."""
    try:
        text = httpx.get(f"{url}/metrics", timeout=2).text
    except httpx.HTTPError:
        return 0.0
    return sum(float(ln.rsplit(" ", 1)[1]) for ln in text.splitlines()
               if ln.startswith("zg_e2e_request_latency_seconds_count"))


@pytest.fixture
def null_engine(cli_runs: list[Cli]) -> str:
    port = free_port()
    c = start(cli_runs, "serve", "--model", "null", "--port", str(port))
    url = f"http://127.0.0.1:{port}"
    wait_for(lambda: healthy(url) or c.proc.poll() is not None, 90, "the engine's /health")
    assert c.proc.poll() is None, c.stderr
    return url


def test_serve_ctrl_c_drains_and_exits_130(cli_runs, null_engine):
    rc = cli_runs[0].ctrl_c()
    assert_interrupted_cleanly(cli_runs[0], rc)


def test_serve_with_gateway_ctrl_c_stops_every_child_and_exits_130(cli_runs, tmp_path):
    port = free_port()
    c = start(cli_runs, "serve", "--model", "null", "--gateway", "nginx", "--gateway-port", str(port), cwd=tmp_path)
    url = f"http://127.0.0.1:{port}"
    wait_for(lambda: "nginx" in c.stdout or c.proc.poll() is not None, 120, "the endpoint table")
    if c.proc.poll() == 4:
        pytest.skip(f"no nginx: {c.stderr.strip()}")
    wait_for(lambda: healthy(url), 30, "the gateway's /health")
    assert_interrupted_cleanly(c, c.ctrl_c())


def test_generate_ctrl_c_mid_stream_exits_130(cli_runs):
    c = start(cli_runs, "generate", "--model", "null", "--prompt", "hi", "--raw", "--max-tokens", "5000000")
    wait_for(lambda: len(c.stdout) > 20 or c.proc.poll() is not None, 90, "generated text")
    assert_interrupted_cleanly(c, c.ctrl_c())


def test_latency_split_ctrl_c_mid_measurement_exits_130_and_keeps_the_work(cli_runs, null_engine, tmp_path):
    out, csv_dir = tmp_path / "split.json", tmp_path / "csv"
    c = start(cli_runs, "latency-split", null_engine, "-n", "100000", "--rounds", "1", "--warmup", "0",
              "-o", str(out), "--csv", str(csv_dir))
    wait_for(lambda: served(null_engine) >= 20 or c.proc.poll() is not None, 90, "requests reaching the engine")
    assert_interrupted_cleanly(c, c.ctrl_c())
    data = json.loads(out.read_text())["data"]          # the finished requests, written
    assert data["interrupted"] is True and data["targets"][0]["num_ok"] >= 1
    assert "True" in (csv_dir / "targets.csv").read_text().splitlines()[1]
    assert "Ctrl-C after" in c.stderr and "total (E2E)" in c.stdout   # the summary of what finished


def test_dcgm_watch_ctrl_c_exits_130(cli_runs, null_engine):
    terminal = {"TTY_COMPATIBLE": "1", "TTY_INTERACTIVE": "1"}     # the live table draws as on a terminal
    c = start(cli_runs, "dcgm", "watch", "--engine", null_engine, "--interval", "0.2", env=terminal)
    wait_for(lambda: "kv" in c.stdout.lower() or c.proc.poll() is not None, 60, "the first sample")
    assert_interrupted_cleanly(c, c.ctrl_c())


def k6_running(tag: str) -> bool:
    for pid in tagged_pids(tag):
        try:
            if Path(f"/proc/{pid}/comm").read_text().strip() == "k6":
                return True
        except OSError:
            continue
    return False


def test_bench_ctrl_c_stops_k6_and_exits_130(cli_runs, null_engine):
    c = start(cli_runs, "bench", "--direct", null_engine, "--gateway", null_engine, "--rate", "5",
              "--duration", "10m", "--scenarios", "direct", "--no-progress")
    wait_for(lambda: k6_running(c.tag) or c.proc.poll() is not None, 90, "k6 to start")
    if c.proc.poll() is not None and "k6" in c.stderr and c.proc.returncode == 4:
        pytest.skip(f"no k6: {c.stderr.strip()}")
    assert_interrupted_cleanly(c, c.ctrl_c())


def test_usage_error_shows_click_usage_and_exits_2():
    proc = subprocess.run([sys.executable, "-m", "zgtool", "latency-split", "--bogus"], capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.startswith("Usage: zgtool latency-split [OPTIONS] TARGETS...")
    assert "Try 'zgtool latency-split --help' for help." in proc.stderr and "No such option: --bogus" in proc.stderr
    assert "UsageError" not in proc.stderr and "NoSuchOption" not in proc.stderr


def test_unknown_command_is_a_usage_error_not_a_class_name():
    proc = subprocess.run([sys.executable, "-m", "zgtool", "nosuch"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "No such command 'nosuch'" in proc.stderr and "Usage: zgtool" in proc.stderr
    assert "UsageError" not in proc.stderr


BOOM = ("import sys\nfrom zgtool.app import app, main\n"
        "@app.command('boom')\ndef boom() -> None:\n    raise RuntimeError('kaputt')\n"
        "main(sys.argv[1:])\n")


@pytest.mark.parametrize("debug", [False, True], ids=["plain", "debug"])
def test_an_unexpected_exception_is_a_bug_exit_1_please_report(debug):
    args = ["--debug", "boom"] if debug else ["boom"]
    proc = subprocess.run([sys.executable, "-c", BOOM, *args], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1, proc.stderr
    assert "RuntimeError: kaputt" in proc.stderr and "please report" in proc.stderr
    assert ("Traceback" in proc.stderr) is debug
    if not debug:
        assert len(proc.stderr.strip().splitlines()) == 1

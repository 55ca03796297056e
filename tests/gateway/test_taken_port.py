"""A port the user names for a gateway or the engine that another process already listens on is refused before
anything starts: that process would answer the readiness check, so `zgtool gateway --kind litellm --port P` said
LiteLLM was up while LiteLLM, importing for seconds, then failed to bind and exited, and every request measured
went to the other server."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

from zgtool.http.net import port_in_use


def test_a_named_port_another_process_listens_on_is_one_usage_line_and_nothing_starts(tmp_path: Path) -> None:
    with socket.socket() as other:
        other.bind(("127.0.0.1", 0))
        other.listen()
        port = other.getsockname()[1]
        run_dir = tmp_path / "run"
        got = subprocess.run([sys.executable, "-m", "zgtool", "gateway", "--kind", "nginx", "--upstream",
                              "http://127.0.0.1:9", "--port", str(port), "--run-dir", str(run_dir)],
                             capture_output=True, text=True, timeout=60)
    assert got.returncode == 2, got.stderr
    (line,) = got.stderr.strip().splitlines()
    assert line == (f"zgtool: port {port} on 127.0.0.1 is already in use by another process: choose another port "
                    "or stop what listens there")
    assert not any(run_dir.glob("nginx*.conf")), list(run_dir.iterdir())


def test_a_listened_port_is_in_use_and_free_again_once_closed() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        assert port_in_use("127.0.0.1", port)
    assert not port_in_use("127.0.0.1", port)

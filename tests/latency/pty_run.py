"""Run the real CLI with its stderr on a pseudo-terminal, as a user at a terminal sees it."""

from __future__ import annotations

import os
import pty
import select
import subprocess
import sys


def run_on_a_terminal(*args: str, timeout_s: float = 120) -> tuple[int, str]:
    """`zgtool ARGS` with stderr on a pseudo-terminal (stdout a pipe); returns (exit code, what the terminal got)."""
    master, slave = pty.openpty()
    env = {**os.environ, "ZGTOOL_PROGRESS_AFTER_S": "0", "COLUMNS": "200", "NO_COLOR": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "zgtool", *args], stdout=subprocess.PIPE, stderr=slave,
                            stdin=subprocess.DEVNULL, env=env)
    os.close(slave)
    got = bytearray()
    try:
        while True:
            ready, _, _ = select.select([master], [], [], timeout_s)
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

"""Helpers of the workload tests (importable by name: tests/conftest.py puts this folder on sys.path)."""

from __future__ import annotations

import socket
import threading
import urllib.request


class Listener:
    """Accepts and counts connections (then closes them): any request sent shows as a count."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = int(self.sock.getsockname()[1])
        self.accepted = 0
        self.stop = False
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        self.sock.settimeout(0.2)
        while not self.stop:
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            self.accepted += 1
            conn.close()

    def close(self) -> None:
        self.stop = True
        self.thread.join(5)
        self.sock.close()


def metric(url: str, name: str) -> float:
    """Sum of a metric family's samples in url's /metrics."""
    with urllib.request.urlopen(url + "/metrics", timeout=5) as r:
        text = r.read().decode()
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name) and not line.startswith("#"):
            rest = line[len(name):]
            if rest[:1] in ("{", " "):
                total += float(line.rsplit(" ", 1)[1])
    return total

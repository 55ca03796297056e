"""Child processes for the local stack: spawn in their own process group, wait until
ready, stop with SIGTERM then SIGKILL. Nothing here knows what the children are."""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from zgtool.http.net import free_port as free_port  # re-exported: other modules import it from here

_PR_SET_PDEATHSIG = 1
_WATCH_S = 0.05      # how often wait_ready looks at the child while a probe is out
_LIVE: set[Child] = set()
_LIVE_LOCK = threading.Lock()

_LIBC: ctypes.CDLL | None
try:  # loaded before any fork: preexec_fn must not import or allocate much
    _LIBC = ctypes.CDLL(None, use_errno=True)
except OSError:  # pragma: no cover - non-glibc platforms
    _LIBC = None


def _die_with_parent() -> None:
    # If the supervising Python process is SIGKILLed, atexit never runs; the kernel
    # then sends SIGTERM to each direct child so no gateway outlives its owner.
    if _LIBC is not None:
        _LIBC.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)


@dataclass(eq=False)
class Child:
    """One supervised process; `name` is what error messages call it ("engine", "nginx")."""

    name: str
    argv: Sequence[str]
    log_path: Path
    env: dict[str, str] | None = None
    proc: subprocess.Popen[bytes] | None = field(default=None, init=False)

    def start(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "ab")  # noqa: SIM115 - the child owns it; closed below
        try:
            self.proc = subprocess.Popen(
                list(self.argv),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=self.env,
                start_new_session=True,  # own process group: killpg reaches grandchildren (nginx workers)
                preexec_fn=_die_with_parent,  # noqa: PLW1509 - only a prctl call
            )
        finally:
            log.close()
        with _LIVE_LOCK:
            _LIVE.add(self)

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def exit_code(self) -> int | None:
        return None if self.proc is None else self.proc.poll()

    def is_alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log_tail(self, lines: int = 5) -> str:
        try:
            text = self.log_path.read_text(errors="replace").strip().splitlines()
        except OSError:
            return ""
        return " | ".join(line.strip() for line in text[-lines:] if line.strip())

    def stop(self, grace_s: float = 5.0) -> None:
        """SIGTERM the whole group, SIGKILL what is left after grace_s; reap."""
        proc = self.proc
        if proc is None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            pass
        # the leader may be gone while workers in its group linger: always sweep the group
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=grace_s)
        with _LIVE_LOCK:
            _LIVE.discard(self)


def stop_all(children: Sequence[Child], grace_s: float = 5.0) -> None:
    """Stop in reverse start order (fronts first, so they never proxy to a dead upstream)."""
    for child in reversed(list(children)):
        child.stop(grace_s)


@atexit.register
def _stop_leftovers() -> None:
    with _LIVE_LOCK:
        left = list(_LIVE)
    stop_all(left, grace_s=2.0)


def wait_ready(
    child: Child,
    probe: Callable[[], bool],
    *,
    timeout_s: float,
    interval_s: float = 0.05,
) -> str | None:
    """Poll `probe` until it returns True. None when ready, else why not (exit or timeout).

    Each probe runs on a thread of its own while the child is watched: a child that exits while a
    probe is waiting on someone else's listener (a port another process holds and never answers)
    is reported at once, not when that probe's own timeout ends."""
    deadline = time.monotonic() + timeout_s
    while True:
        code = child.exit_code()
        if code is not None:
            return f"exited with code {code}"
        verdict = _probe_watching(child, probe, deadline)
        if verdict is True:
            return None
        code = child.exit_code()
        if code is not None:
            return f"exited with code {code}"
        if time.monotonic() > deadline:
            return f"not ready after {timeout_s:g} s"
        time.sleep(interval_s)
        interval_s = min(interval_s * 1.5, 0.5)


def _probe_watching(child: Child, probe: Callable[[], bool], deadline: float) -> bool | None:
    """probe()'s answer (an exception is False); None when the child exited or the deadline passed
    first (the probe's thread is left to end by its own timeout: it is a daemon)."""
    answer: list[bool] = []
    done = threading.Event()

    def run() -> None:
        try:
            answer.append(bool(probe()))
        except Exception:  # noqa: BLE001 - not answering yet is what a probe's error means
            answer.append(False)
        finally:
            done.set()

    threading.Thread(target=run, name=f"ready-probe-{child.name}", daemon=True).start()
    while not done.wait(_WATCH_S):
        if child.exit_code() is not None or time.monotonic() > deadline:
            return None
    return answer[0]


def http_ok(url: str, *, auth: tuple[str, str] | None = None, timeout_s: float = 2.0) -> Callable[[], bool]:
    """A readiness probe: GET url answers 200 (TLS certificates not verified: ours are self-signed)."""

    def probe() -> bool:
        import httpx

        r = httpx.get(url, auth=auth, timeout=timeout_s, verify=False)
        return r.status_code == 200

    return probe

"""What the verify tests share: the processes a run owns, and the one `verify --quick` run (conftest.py)."""

from __future__ import annotations

import os
import time
from pathlib import Path

MARK = "ZGTOOL_TEST_VERIFY_MARK"
MODEL = "dummy:tiny"   # real compute, small enough for a ~1 min --quick run on 2 cores


def owned(mark: str, out: Path) -> list[int]:
    """Processes the run started: its environment marker (engine, pygw, k6), its run folder on the
    command line (nginx clears its environment), and every member of those processes' sessions
    (nginx workers; each child runs in its own session)."""
    needle = f"{MARK}={mark}".encode()
    where = str(out).encode()
    procs: dict[int, tuple[bytes, bytes, int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            env = (entry / "environ").read_bytes()
            cmd = (entry / "cmdline").read_bytes()
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        if fields[0] == "Z":   # a zombie has exited; only its parent's wait() is missing
            continue
        procs[int(entry.name)] = (env, cmd, int(fields[3]))   # fields[3]: session id
    roots = {pid for pid, (env, cmd, _) in procs.items() if needle in env.split(b"\0") or where in cmd}
    return sorted(roots | {pid for pid, (_, _, sid) in procs.items() if sid in roots})


def left_over(mark: str, out: Path, timeout_s: float = 10.0) -> list[int]:
    """Processes still tagged once exiting children had the time to be reaped: a leak is what
    remains after the deadline, not what is still on its way out."""
    deadline = time.monotonic() + timeout_s
    while (pids := owned(mark, out)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return pids


def csv_dir(out: Path) -> Path:
    """Where the quick run writes its --csv files: beside its report folder."""
    return out.parent / "csv"

"""Run one k6 script as a child process, with a Rich progress bar, and read its JSON summary."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from zgtool.errors import UsageError

# k6's own exit codes (grafana/k6 errext/exitcodes); 99 is "thresholds failed", which
# zgtool's scripts never set up to fail, so any non-zero code here is a real problem.
K6_EXIT_MEANINGS = {99: "thresholds failed", 104: "invalid config", 105: "external abort",
                    107: "script exception", 108: "script aborted"}


@dataclass(frozen=True)
class K6Run:
    """One k6 invocation; `env` carries the script's settings (and keys, never argv)."""

    k6: Path
    script: Path
    env: dict[str, str]
    run_dir: Path
    expected_s: float  # for the progress bar
    summary_name: str = "summary.json"
    timeout_s: float | None = None
    extra_args: tuple[str, ...] = ()  # e.g. execution segments, --out csv=...

    @property
    def summary_path(self) -> Path:
        return self.run_dir / self.summary_name


@dataclass(frozen=True)
class K6Output:
    summary: dict[str, Any]
    wall_s: float
    exit_code: int
    log_path: Path
    stdout: str = ""
    warnings: tuple[str, ...] = field(default_factory=tuple)


def run_k6(run: K6Run, *, progress: bool = True, label: str = "k6") -> K6Output:
    run.run_dir.mkdir(parents=True, exist_ok=True)
    log_path = run.run_dir / "k6.log"
    out_path = run.run_dir / "k6.stdout"
    # k6 runs in the script folder: the summary path must not be relative to ours
    env = {**os.environ, "K6_NO_USAGE_REPORT": "true", **run.env, "SUMMARY": str(run.summary_path.resolve())}
    if run.summary_path.exists():
        run.summary_path.unlink()
    cmd = [str(run.k6), "run", "--quiet", "--no-usage-report", "--no-color", *run.extra_args, str(run.script)]
    t0 = time.monotonic()
    with open(log_path, "wb") as log, open(out_path, "wb") as out:
        # own process group: Ctrl-C in the terminal reaches zgtool, which stops k6 itself
        proc = subprocess.Popen(cmd, cwd=run.script.parent, env=env, stdout=out, stderr=log,
                                start_new_session=True)
        try:
            _wait(proc, run, t0, progress, label)
        except subprocess.TimeoutExpired as exc:
            _stop(proc)
            raise UsageError(f"k6 did not finish within {run.timeout_s:.0f}s; log {log_path}") from exc
        except BaseException:
            _stop(proc)
            raise
    wall_s = time.monotonic() - t0
    stdout = out_path.read_text(errors="replace")
    log_text = log_path.read_text(errors="replace")
    warnings = tuple(line for line in log_text.splitlines() if "level=warning" in line or "WARN" in line)
    if not run.summary_path.exists():
        tail = "\n".join(log_text.strip().splitlines()[-5:])
        meaning = K6_EXIT_MEANINGS.get(proc.returncode, "")
        raise UsageError(f"k6 exited with code {proc.returncode}{f' ({meaning})' if meaning else ''} and wrote "
                         f"no summary; log {log_path}:\n{tail}")
    try:
        summary = json.loads(run.summary_path.read_text())
    except json.JSONDecodeError as exc:
        raise UsageError(f"k6 summary {run.summary_path} is not JSON: {exc}") from exc
    return K6Output(summary, wall_s, proc.returncode, log_path, stdout, warnings)


def _wait(proc: subprocess.Popen[bytes], run: K6Run, t0: float, progress: bool, label: str) -> None:
    deadline = None if run.timeout_s is None else t0 + run.timeout_s
    if not progress:
        proc.wait(timeout=run.timeout_s)
        return
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    from zgtool.output import err_console

    columns = (TextColumn("[bold]{task.description}"), BarColumn(), TimeElapsedColumn(),
               TextColumn("of ~{task.total:.0f}s"), TimeRemainingColumn())
    with Progress(*columns, console=err_console, transient=True) as bar:
        task = bar.add_task(label, total=max(run.expected_s, 1.0))
        while proc.poll() is None:
            now = time.monotonic()
            if deadline is not None and now > deadline:
                raise subprocess.TimeoutExpired(proc.args, run.timeout_s or 0)
            bar.update(task, completed=min(now - t0, run.expected_s))
            time.sleep(0.2)
        bar.update(task, completed=run.expected_s)


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """SIGINT first: k6 then stops its VUs and still writes a summary; kill if it lingers."""
    if proc.poll() is not None:
        return
    for sig, wait_s in ((signal.SIGINT, 5.0), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait_s)
            return
        except subprocess.TimeoutExpired:
            continue

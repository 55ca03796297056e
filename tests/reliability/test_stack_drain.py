"""SIGTERM to `zgtool serve --gateway stack` (real nginx -> pygw -> engine): the stack drains
front first, engine last; a stream in flight finishes within --grace-s, and past it ends
with the API's own error event instead of a cut connection; clean logs, no orphans
(issue 16, item 1)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import anthropic
from zgtest import poll

from zgtool.http.net import free_port

ZGTOOL = [sys.executable, "-m", "zgtool"]


_wait_for = poll


def _descendants(root: int) -> dict[int, str]:
    """pid -> command line of every process below root."""
    kids: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            kids.setdefault(int(stat.rsplit(")", 1)[1].split()[1]), []).append(int(entry))
    out: dict[int, str] = {}
    todo = [root]
    while todo:
        for c in kids.get(todo.pop(), []):
            try:
                out[c] = Path(f"/proc/{c}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            except OSError:
                out[c] = ""
            todo.append(c)
    return out


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _accepts(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
    except OSError:
        return False


@dataclass
class Stack:
    proc: subprocess.Popen[str]
    front: int
    pygw: int
    engine: int
    cwd: Path
    lines: list[str] = field(default_factory=list)

    def logs(self) -> str:
        return "".join(p.read_text(errors="replace") for p in self.cwd.glob("runs/*/*.log"))


def _start(tmp_path: Path, grace_s: float) -> Stack:
    front, engine = free_port(), free_port()
    proc = subprocess.Popen([*ZGTOOL, "serve", "--model", "dummy:small", "--port", str(engine), "--gateway", "stack",
                             "--gateway-port", str(front), "--grace-s", str(grace_s)],
                            cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    st = Stack(proc, front, 0, engine, tmp_path)
    assert proc.stdout is not None
    threading.Thread(target=lambda: st.lines.extend(iter(proc.stdout.readline, "")), daemon=True).start()
    # the endpoint table is printed once every part is ready
    ok = _wait_for(lambda: proc.poll() is not None or any(str(front) in ln for ln in list(st.lines)), 180)
    assert ok and proc.poll() is None, "".join(st.lines)
    pygw = [cmd for cmd in _descendants(proc.pid).values() if "zgtool.gateway.pygw" in cmd]
    argv = pygw[0].split()
    st.pygw = int(argv[argv.index("--port") + 1])
    return st


@dataclass
class StreamRun:
    """An Anthropic SDK stream through the front, read in a thread."""

    text: list[str] = field(default_factory=list)
    started: threading.Event = field(default_factory=threading.Event)
    final: object = None
    error: BaseException | None = None
    ended_at: float = 0.0


def _stream(port: int, max_tokens: int) -> tuple[StreamRun, threading.Thread]:
    run = StreamRun()

    def go() -> None:
        client = anthropic.Anthropic(base_url=f"http://127.0.0.1:{port}", api_key="k", max_retries=0, timeout=600)
        try:
            with client.messages.stream(model="dummy:small", max_tokens=max_tokens,
                                        messages=[{"role": "user", "content": "drain me"}]) as s:
                for t in s.text_stream:
                    run.text.append(t)
                    run.started.set()
                run.final = s.get_final_message()
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            run.error = exc
        finally:
            run.ended_at = time.monotonic()
            run.started.set()

    t = threading.Thread(target=go, daemon=True)
    t.start()
    return run, t


def _stop_and_check_clean(st: Stack) -> None:
    kids = set(_descendants(st.proc.pid))
    assert st.proc.wait(timeout=120) == 0, "".join(st.lines)
    assert _wait_for(lambda: not any(_alive(p) for p in kids), 15), [p for p in kids if _alive(p)]
    logs = st.logs()
    assert "Traceback" not in logs and "CancelledError" not in logs, logs[-3000:]


def test_sigterm_lets_a_stream_through_the_stack_finish_and_drains_front_first(tmp_path: Path) -> None:
    st = _start(tmp_path, grace_s=90)
    try:
        run, thread = _stream(st.front, 40)
        assert run.started.wait(120) and run.error is None, run.error
        refused: dict[str, float] = {}
        ports = {"front": st.front, "pygw": st.pygw, "engine": st.engine}
        st.proc.send_signal(signal.SIGTERM)

        def poll_ports() -> bool:
            for name, port in ports.items():
                if name not in refused and not _accepts(port):
                    refused[name] = time.monotonic()
            return len(refused) == 3

        assert _wait_for(poll_ports, 120, interval_s=0.02), refused
        thread.join(120)
        assert run.error is None, run.error
        assert run.final is not None and run.final.stop_reason == "max_tokens"  # type: ignore[attr-defined]
        assert run.final.usage.output_tokens == 40  # type: ignore[attr-defined]
        # the front stopped taking connections while the stream was still running; pygw and
        # the engine kept serving it and stopped after, the engine last
        assert refused["front"] < run.ended_at, (refused, run.ended_at)
        assert refused["front"] < refused["pygw"] <= refused["engine"], refused
        _stop_and_check_clean(st)
    finally:
        if st.proc.poll() is None:
            st.proc.kill()
            st.proc.wait()


def test_a_stream_still_running_when_grace_runs_out_ends_with_an_overloaded_error_event(tmp_path: Path) -> None:
    st = _start(tmp_path, grace_s=1)
    try:
        run, thread = _stream(st.front, 1500)  # minutes of generation on this CPU
        assert run.started.wait(120) and run.error is None, run.error
        t_sig = time.monotonic()
        st.proc.send_signal(signal.SIGTERM)
        thread.join(60)
        assert not thread.is_alive()
        assert isinstance(run.error, anthropic.APIError), run.error
        assert "shutting down" in str(run.error) and run.final is None
        assert run.ended_at - t_sig < 15  # grace (1 s) + the drain's margins, not the whole answer
        _stop_and_check_clean(st)
    finally:
        if st.proc.poll() is None:
            st.proc.kill()
            st.proc.wait()

"""zgtool/progress.py alone: the line's wording, drawing only on a terminal and not with --quiet, after
the start delay, throttled, counted from many threads, and ended cleanly (a stepped clock, no sleeps)."""

from __future__ import annotations

import io
import threading
from typing import Any

from zgtool.progress import ProgressLine, line


class Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_the_line_says_done_of_total_rate_errors_and_elapsed() -> None:
    assert line("latency-split", 37, 100, 1, 2.0) == "latency-split  37/100 requests  18.5 req/s  1 error  2.0s"
    assert line("x", 0, None, 2, 0.0) == "x  0 requests  0.0 req/s  2 errors  0.0s"


def test_nothing_is_drawn_off_a_terminal_or_with_quiet() -> None:
    for stream, quiet in ((io.StringIO(), False), (Tty(), True)):
        bar = ProgressLine("run", 3, stream=stream, quiet=quiet, after_s=0)
        bar.add()
        bar.close()
        assert stream.getvalue() == ""


def test_drawn_in_place_after_the_delay_throttled_and_ended_with_the_last_count() -> None:
    clock, out = Clock(), Tty()
    bar = ProgressLine("run", 4, stream=out, after_s=1.0, interval_s=0.5, clock=clock)
    bar.add()
    assert out.getvalue() == ""                      # the first second: nothing
    clock.t += 1.0
    bar.add(ok=False)
    assert out.getvalue().count("\r") == 1 and "2/4 requests" in out.getvalue() and "1 error" in out.getvalue()
    bar.add()                                        # within the interval: not redrawn
    assert out.getvalue().count("\r") == 1
    clock.t += 0.5
    bar.advance_to(4)
    assert out.getvalue().count("\r") == 2 and "4/4 requests" in out.getvalue()
    bar.close()
    assert out.getvalue().endswith("\n") and out.getvalue().count("\r") == 3


def test_a_run_shorter_than_the_delay_leaves_no_trace() -> None:
    out = Tty()
    with ProgressLine("run", 2, stream=out, after_s=5.0, clock=Clock()) as bar:
        bar.add()
        bar.add()
    assert out.getvalue() == ""


def test_counts_from_many_threads_add_up() -> None:
    bar = ProgressLine("run", 800, stream=Tty(), after_s=0, interval_s=0)
    threads = [threading.Thread(target=lambda: [bar.add(ok=i % 2 == 0) for i in range(100)]) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert (bar.done, bar.errors) == (800, 400)


def test_clear_blanks_the_line_for_other_output_and_the_next_count_redraws_it() -> None:
    out = Tty()
    bar = ProgressLine("run", 3, stream=out, after_s=0, interval_s=10, clock=Clock())
    bar.add()
    bar.clear()
    assert out.getvalue().endswith("\r\x1b[K")
    bar.add()                                   # within the interval, but the line was blanked: drawn again
    assert out.getvalue().endswith("2/3 requests  0.0 req/s  0 errors  0.0s\x1b[K")


def test_the_counting_hook_counts_each_request_around_the_inner_hook() -> None:
    from types import SimpleNamespace

    from zgtool.progress import CountingHook

    calls: list[str] = []

    class Inner:
        def before(self) -> str:
            calls.append("before")
            return "token"

        def after(self, token: str, sample: object) -> None:
            calls.append(f"after {token}")

    bar = ProgressLine("run", 2, stream=Tty(), after_s=0)
    hook = CountingHook(bar, Inner())
    hook.after(hook.before(), SimpleNamespace(ok=True))
    CountingHook(bar).after(None, SimpleNamespace(ok=False))
    assert calls == ["before", "after token"] and (bar.done, bar.errors) == (2, 1)


def test_warm_ups_go_through_every_chained_hook_once_and_are_not_counted() -> None:
    from zgtool.progress import CountingHook
    from zgtool.workload.prefix_cache import Chain

    calls: list[str] = []

    class Waits:     # a hook that waits for the warm-ups' effects (vLLM's histogram deltas)
        def __init__(self, name: str) -> None:
            self.name = name

        def unmeasured(self, send: Any) -> Any:
            calls.append(f"{self.name} in")
            out = send()
            calls.append(f"{self.name} out")
            return out

    def send() -> list[str]:
        calls.append("send")
        return ["sample"]

    bar = ProgressLine("run", 2, stream=Tty(), after_s=0)
    assert CountingHook(bar, Chain(Waits("a"), None, Waits("b"))).unmeasured(send) == ["sample"]
    assert calls == ["b in", "a in", "send", "a out", "b out"]
    assert CountingHook(bar).unmeasured(send) == ["sample"] and (bar.done, bar.errors) == (0, 0)

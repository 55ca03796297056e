"""A large request beside a stream stepped flat out: how long its answer takes, against the same request
on a quiet server (the GIL hand-over of engine/server/offload.py, measured through real sockets).

    .venv/bin/python bench/gil_handover.py [--rounds 3] [--messages 20000] [--baseline DIR]

Each system is `zgtool serve --model null --max-model-len 2000000` (tests/support/engine_live.py's child),
all started at once; rounds measure each in turn, who goes first rotating.
Its big request is POST /v1/messages with ``--messages`` empty messages and max_tokens 2: a body of
about 35 bytes per message, decoded and parsed in a worker thread (engine/server/intake.py). Rounds
alternate two cells per system: ``quiet`` (the big request alone) and ``busy`` (the same while a stream of
1,000,000 tokens is read by a client thread of this process, which counts its deltas). --baseline DIR
adds the same server from another tree (e.g. the commit before the hand-over: ``git archive COMMIT |
tar -x -C DIR && ln -s ../engine DIR/zgtool/engine``), the before of the change in the same run.

Prints each system's median seconds quiet and busy, busy / quiet, and the stream's tokens per second
while the big request ran (it keeps flowing: the loop shares the CPU, it does not stop); the LAST line
is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from peerlib.machine import cpu_model  # noqa: E402
from peerlib.trees import Tree, null_servers, rotated, trees  # noqa: E402

HEADERS = {"anthropic-version": "2023-06-01"}
REQUEST_TIMEOUT_S = 300.0


@dataclass(frozen=True)
class Cell:
    seconds: float
    stream_tokens: int     # deltas the concurrent stream delivered meanwhile (0 when quiet)


def big_body(messages: int) -> dict[str, object]:
    msgs = [{"role": "user" if i % 2 == 0 else "assistant", "content": ""} for i in range(messages)]
    return {"model": "null", "max_tokens": 2, "messages": msgs}


def _timed(url: str, body: dict[str, object]) -> float:
    t0 = time.perf_counter()
    r = httpx.post(url + "/v1/messages", json=body, headers=HEADERS, timeout=REQUEST_TIMEOUT_S)
    if r.status_code != 200:
        raise SystemExit(f"the big request got {r.status_code}: {r.text[:300]}")
    return time.perf_counter() - t0


class Stream:
    """A stream of a million tokens read (and counted) by a thread until closed."""

    def __init__(self, url: str) -> None:
        self.deltas = 0
        self.started = threading.Event()
        self.stop = threading.Event()
        self.error: str | None = None
        self.thread = threading.Thread(target=self._read, args=(url,), daemon=True)

    def _read(self, url: str) -> None:
        body = {"model": "null", "max_tokens": 1_000_000, "stream": True, "messages": [{"role": "user", "content": "hi"}]}
        try:
            with httpx.Client(timeout=REQUEST_TIMEOUT_S) as c, c.stream("POST", url + "/v1/messages", json=body,
                                                                        headers=HEADERS) as r:
                for line in r.iter_lines():
                    if "content_block_delta" in line:
                        self.deltas += 1
                        self.started.set()
                    if self.stop.is_set():
                        return
                self.error = "the stream ended before it was closed"
        except httpx.HTTPError as exc:
            self.error = f"the stream failed: {exc}"
        finally:
            self.started.set()

    def __enter__(self) -> Stream:
        self.thread.start()
        if not self.started.wait(60) or self.error:
            raise SystemExit(self.error or "the stream never started")
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(60)


def measure(url: str, body: dict[str, object], busy: bool) -> Cell:
    if not busy:
        return Cell(_timed(url, body), 0)
    with Stream(url) as s:
        before = s.deltas
        seconds = _timed(url, body)
        tokens = s.deltas - before
    if s.error:
        raise SystemExit(s.error)
    return Cell(seconds, tokens)


def run(systems: list[Tree], rounds: int, messages: int) -> dict[str, dict[str, list[Cell]]]:
    """Every system's server started at once; each round measures each system (who goes first rotates),
    quiet then busy or busy then quiet in turn, so that a busy moment of the machine falls on all."""
    body = big_body(messages)
    cells: dict[str, dict[str, list[Cell]]] = {s.name: {"quiet": [], "busy": []} for s in systems}
    with null_servers(systems, "--max-model-len", "2000000") as lives:
        for live in lives.values():
            _timed(live.url, body)                        # warm up: memos, the worker thread
        for r in range(rounds):
            for s in rotated(systems, r):
                for kind in (("quiet", "busy") if r % 2 == 0 else ("busy", "quiet")):
                    cells[s.name][kind].append(measure(lives[s.name].url, body, kind == "busy"))
    return cells


def summary(cells: dict[str, dict[str, list[Cell]]]) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    for name, kinds in cells.items():
        quiet = round(statistics.median(c.seconds for c in kinds["quiet"]), 4)     # the ratio is of the figures
        busy = round(statistics.median(c.seconds for c in kinds["busy"]), 4)
        rate = statistics.median(c.stream_tokens / c.seconds for c in kinds["busy"])
        out[name] = {"quiet_s": quiet, "busy_s": busy, "busy_over_quiet": round(busy / quiet, 2),
                     "busy_s_min": round(min(c.seconds for c in kinds["busy"]), 4),
                     "busy_s_max": round(max(c.seconds for c in kinds["busy"]), 4),
                     "stream_tokens_per_s_meanwhile": round(rate, 1)}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--messages", type=int, default=20_000)
    ap.add_argument("--baseline", type=Path, default=None, help="another tree whose server runs beside")
    args = ap.parse_args()
    if args.rounds < 1:
        raise SystemExit("--rounds must be at least 1")
    if args.messages < 1:
        raise SystemExit("--messages must be at least 1")
    figures = summary(run(trees(args.baseline), args.rounds, args.messages))
    print(f"{'system':<10} {'quiet s':>8} {'busy s (median, min-max)':>25} {'busy/quiet':>11} "
          f"{'stream tok/s meanwhile':>23}")
    for name, f in figures.items():
        print(f"{name:<10} {f['quiet_s']:>8.3f} {f['busy_s']:>9.3f} ({f['busy_s_min']:.3f}-{f['busy_s_max']:.3f}) "
              f"{f['busy_over_quiet']:>10.2f}x {f['stream_tokens_per_s_meanwhile']:>23.1f}")
    ratios = {}
    if "baseline" in figures:
        ratios["baseline_busy_over_zgtool_busy"] = round(figures["baseline"]["busy_s"] / figures["zgtool"]["busy_s"], 2)
        print(f"baseline busy / zgtool busy: {ratios['baseline_busy_over_zgtool_busy']:.2f}x")
    print(f"({cpu_model()}, {args.rounds} round(s), {args.messages} messages)")
    print(json.dumps({"bench": "gil_handover", "cpu": cpu_model(), "rounds": args.rounds, "messages": args.messages,
                      "systems": figures, **ratios}))


if __name__ == "__main__":
    main()

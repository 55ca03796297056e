"""What one stalled stream costs a server and its other clients: a client that stops reading a long
stream (its socket's buffers full, the server's writes paused) until the write timeout cuts it off.

    .venv/bin/python bench/stalled_reader.py [--rounds 3] [--seconds 2] [--baseline DIR]

Each system is `zgtool serve --model null --max-model-len 2000000` (tests/support/engine_live.py's child),
all started at once; rounds measure each in turn, who goes first rotating. A round per system:

1. ``quiet``: a neighbour (one keep-alive client, POST /v1/messages with one output token, back to back)
   for ``--seconds``: its requests/s;
2. a stalled reader connects (SO_RCVBUF 4 KiB), sends a stream of 1,000,000 tokens and never reads;
   after a settle of 0.5 s (the socket buffers fill), the server's CPU (user+system from /proc) is read
   over ``--seconds`` with nothing else running: what the stalled stream alone costs;
3. ``stalled``: the neighbour again for ``--seconds``, beside the stalled reader; then the stalled socket
   is closed (the server aborts its request) and the server's resident memory growth is noted.

--baseline DIR adds the same server from another tree (e.g. the commit before the engine held stalled
streams: ``git archive COMMIT | tar -x -C DIR && ln -s ../engine DIR/zgtool/engine``), the before of
the change in the same run. Prints, per system, the stalled stream's CPU alone, the neighbour's
requests/s quiet and stalled and their ratio, and the resident memory it grew by; the LAST line is one
JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "support"))
from engine_live import Live, connect, raw_request  # noqa: E402  (the live-engine fixture the tests use)
from peerlib.machine import cpu_model  # noqa: E402
from peerlib.trees import Tree, null_servers, rotated, trees  # noqa: E402

HEADERS = {"anthropic-version": "2023-06-01"}
SMALL = {"model": "null", "max_tokens": 1, "messages": [{"role": "user", "content": "hi"}]}
STALLED = {"model": "null", "max_tokens": 1_000_000, "stream": True, "messages": [{"role": "user", "content": "hi"}]}
SETTLE_S = 0.5
CLK_TCK = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class Round:
    quiet_rps: float
    stalled_rps: float
    stalled_alone_cpu_pct: float   # the server's CPU while only the stalled reader is connected
    rss_growth_mb: float           # resident memory grown over the stalled reader's life


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK     # utime + stime


def rss_mb(live: Live) -> float:
    return live.rss_kb() / 1024


def neighbour_rps(url: str, seconds: float) -> float:
    n = 0
    with httpx.Client(timeout=30, headers=HEADERS) as c:
        deadline = time.perf_counter() + seconds
        t0 = time.perf_counter()
        while time.perf_counter() < deadline:
            r = c.post(url + "/v1/messages", json=SMALL)
            if r.status_code != 200:
                raise SystemExit(f"the neighbour's request got {r.status_code}: {r.text[:300]}")
            n += 1
        return n / (time.perf_counter() - t0)


def measure(live: Live, seconds: float) -> Round:
    assert live.proc is not None
    pid = live.proc.pid
    quiet = neighbour_rps(live.url, seconds)
    rss0 = rss_mb(live)
    s = connect(live.port, rcvbuf=4096)
    try:
        s.sendall(raw_request(live.port, "/v1/messages", STALLED, headers=HEADERS))
        time.sleep(SETTLE_S)                               # the socket buffers fill; the writer pauses
        c0, t0 = cpu_s(pid), time.perf_counter()
        time.sleep(seconds)                                # nothing but the stalled stream runs
        alone = (cpu_s(pid) - c0) / (time.perf_counter() - t0) * 100
        stalled = neighbour_rps(live.url, seconds)
        grown = rss_mb(live) - rss0
    finally:
        s.close()
    deadline = time.monotonic() + 30
    while live.kv_used():                                  # its abort has freed the blocks: next round
        if time.monotonic() > deadline:
            raise SystemExit("the stalled stream's blocks were not freed after its client left")
        time.sleep(0.05)
    return Round(quiet, stalled, alone, grown)


def run(systems: list[Tree], rounds: int, seconds: float) -> dict[str, list[Round]]:
    out: dict[str, list[Round]] = {s.name: [] for s in systems}
    with null_servers(systems, "--max-model-len", "2000000") as lives:
        for live in lives.values():
            neighbour_rps(live.url, 0.2)                   # warm up
        for r in range(rounds):
            for s in rotated(systems, r):
                out[s.name].append(measure(lives[s.name], seconds))
    return out


def summary(rounds: dict[str, list[Round]]) -> dict[str, dict[str, float]]:
    figures: dict[str, dict[str, float]] = {}
    for name, rs in rounds.items():
        quiet = round(statistics.median(r.quiet_rps for r in rs), 1)       # the ratio is of the figures
        stalled = round(statistics.median(r.stalled_rps for r in rs), 1)
        figures[name] = {"quiet_rps": quiet, "stalled_rps": stalled,
                         "stalled_over_quiet": round(stalled / quiet, 2),
                         "stalled_alone_cpu_pct": round(statistics.median(r.stalled_alone_cpu_pct for r in rs), 1),
                         "rss_growth_mb": round(statistics.median(r.rss_growth_mb for r in rs), 1)}
    return figures


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=2.0)
    ap.add_argument("--baseline", type=Path, default=None, help="another tree whose server runs beside")
    args = ap.parse_args()
    if args.rounds < 1:
        raise SystemExit("--rounds must be at least 1")
    if not args.seconds > 0:
        raise SystemExit("--seconds must be more than 0")
    figures = summary(run(trees(args.baseline), args.rounds, args.seconds))
    print(f"{'system':<10} {'stalled stream alone, CPU %':>28} {'neighbour req/s quiet':>22} {'stalled':>9} "
          f"{'ratio':>6} {'RSS grown MB':>13}")
    for name, f in figures.items():
        print(f"{name:<10} {f['stalled_alone_cpu_pct']:>28.1f} {f['quiet_rps']:>22.1f} {f['stalled_rps']:>9.1f} "
              f"{f['stalled_over_quiet']:>5.2f}x {f['rss_growth_mb']:>13.1f}")
    ratios = {}
    if "baseline" in figures:
        z, b = figures["zgtool"], figures["baseline"]
        ratios["zgtool_over_baseline_stalled_rps"] = round(z["stalled_rps"] / b["stalled_rps"], 2)
        print(f"neighbour beside a stalled reader, zgtool / baseline: {ratios['zgtool_over_baseline_stalled_rps']:.2f}x")
    print(f"({cpu_model()}, {args.rounds} round(s) of {args.seconds:g} s per cell)")
    print(json.dumps({"bench": "stalled_reader", "cpu": cpu_model(), "rounds": args.rounds, "seconds": args.seconds,
                      "systems": figures, **ratios}))


if __name__ == "__main__":
    main()

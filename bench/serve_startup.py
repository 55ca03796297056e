"""How long `zgtool serve` takes to answer /health, and what it holds once it does: the null backend (no torch)
beside dummy:tiny (the smallest model with weights, which loads torch), spawned in turn, several rounds.

    .venv/bin/python bench/serve_startup.py [--rounds 3] [--baseline DIR]

Each start (tests/support/engine_live.py's child): spawn `python -m zgtool serve --model M`, poll GET /health
every 10 ms, then read the process's resident memory (VmRSS) and whether libtorch is mapped, then SIGTERM and
reap. Rounds interleave the systems, so a busy moment of the machine falls on all of them. --baseline DIR adds the null backend served from
another tree (run in DIR, e.g. an older commit: ``git archive COMMIT | tar -x -C DIR && ln -s ../engine
DIR/zgtool/engine``), the before of a change on the same machine in the same run.

Prints each system's median time to ready, its RSS and torch, and the ratios to null's; the LAST line is one
JSON object.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "support"))
from engine_live import EngineFailed, child  # noqa: E402  (the live-engine fixture the tests use)
from peerlib.machine import cpu_model  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
POLL_S = 0.01
READY_TIMEOUT_S = 120.0


@dataclass(frozen=True)
class Start:
    ready_s: float
    rss_mb: float
    torch_loaded: bool


@dataclass(frozen=True)
class System:
    name: str
    model: str
    cwd: Path


def start_once(system: System) -> Start:
    """One start of `system`, measured and stopped; SystemExit naming it when it exits or never answers."""
    with tempfile.TemporaryDirectory(prefix="zg-startup-") as tmp:
        t0 = time.perf_counter()
        try:
            with child(Path(tmp), keyed=False, model=system.model, cwd=system.cwd, poll_s=POLL_S,
                       health_timeout_s=READY_TIMEOUT_S) as live:
                ready_s = time.perf_counter() - t0
                assert live.proc is not None
                status = Path(f"/proc/{live.proc.pid}/status").read_text()
                rss_kb = int(status.split("VmRSS:")[1].split()[0])
                torch_loaded = "libtorch" in Path(f"/proc/{live.proc.pid}/maps").read_text()
        except EngineFailed as exc:
            raise SystemExit(f"{system.name}: {str(exc).splitlines()[0]}") from None
    return Start(ready_s, rss_kb / 1024, torch_loaded)


def run(systems: list[System], rounds: int) -> dict[str, list[Start]]:
    starts: dict[str, list[Start]] = {s.name: [] for s in systems}
    for r in range(rounds):
        for s in systems[r % len(systems):] + systems[:r % len(systems)]:   # who goes first rotates
            starts[s.name].append(start_once(s))
    return starts


def summary(starts: dict[str, list[Start]]) -> dict[str, dict[str, float | bool]]:
    out: dict[str, dict[str, float | bool]] = {}
    for name, xs in starts.items():
        out[name] = {"ready_s": round(statistics.median(x.ready_s for x in xs), 3),
                     "ready_s_min": round(min(x.ready_s for x in xs), 3),
                     "ready_s_max": round(max(x.ready_s for x in xs), 3),
                     "rss_mb": round(statistics.median(x.rss_mb for x in xs), 1),
                     "torch_loaded": any(x.torch_loaded for x in xs)}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--baseline", type=Path, default=None, help="another tree whose null backend starts beside")
    args = ap.parse_args()
    if args.rounds < 1:
        raise SystemExit("--rounds must be at least 1")
    systems = [System("null", "null", ROOT), System("dummy:tiny", "dummy:tiny", ROOT)]
    if args.baseline is not None:
        if not (args.baseline / "zgtool").is_dir():
            raise SystemExit(f"--baseline {args.baseline}: no zgtool/ there")
        systems.append(System("baseline null", "null", args.baseline))
    figures = summary(run(systems, args.rounds))
    null = figures["null"]
    print(f"{'system':<14} {'ready s (median, min-max)':>27} {'RSS MB':>8} {'torch':>6} {'x null ready':>13}")
    ratios: dict[str, float] = {}
    for name, f in figures.items():
        ratios[name] = round(float(f["ready_s"]) / float(null["ready_s"]), 2)
        print(f"{name:<14} {f['ready_s']:>10.3f} ({f['ready_s_min']:.3f}-{f['ready_s_max']:.3f}) "
              f"{f['rss_mb']:>8.1f} {'yes' if f['torch_loaded'] else 'no':>6} {ratios[name]:>12.2f}x")
    print(f"({cpu_model()}, {args.rounds} round(s))")
    print(json.dumps({"bench": "serve_startup", "cpu": cpu_model(), "rounds": args.rounds, "systems": figures,
                      "ready_ratio_to_null": ratios}))


if __name__ == "__main__":
    main()

"""This tree and, with --baseline DIR, another one beside it (the before of a change, measured in the same
run): their null servers started at once, for the benches that compare two trees through real sockets
(bench/gil_handover.py, bench/stalled_reader.py). DIR is another commit's tree:
``git archive COMMIT | tar -x -C DIR && ln -s ../engine DIR/zgtool/engine``."""

from __future__ import annotations

import contextlib
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "support"))
from engine_live import EngineFailed, Live, child  # noqa: E402  (the live-engine fixture the tests use)


@dataclass(frozen=True)
class Tree:
    name: str
    cwd: Path


def trees(baseline: Path | None) -> list[Tree]:
    """[this tree as "zgtool"] plus "baseline" at DIR; a DIR with no zgtool/ is a one-line exit."""
    out = [Tree("zgtool", ROOT)]
    if baseline is not None:
        if not (baseline / "zgtool").is_dir():
            raise SystemExit(f"--baseline {baseline}: no zgtool/ there")
        out.append(Tree("baseline", baseline))
    return out


@contextlib.contextmanager
def null_servers(which: list[Tree], *serve_args: str) -> Iterator[dict[str, Live]]:
    """Each tree's `zgtool serve --model null SERVE_ARGS` (open, no keys), all up at once, stopped after."""
    with tempfile.TemporaryDirectory(prefix="zg-trees-") as tmp, contextlib.ExitStack() as stack:
        lives: dict[str, Live] = {}
        for t in which:
            folder = Path(tmp) / t.name
            folder.mkdir()
            try:
                lives[t.name] = stack.enter_context(child(folder, *serve_args, keyed=False, cwd=t.cwd))
            except EngineFailed as exc:
                raise SystemExit(f"{t.name}: {str(exc).splitlines()[0]}") from None
        yield lives


def rotated(which: list[Tree], round_no: int) -> list[Tree]:
    """The trees in the order of round ``round_no``: who goes first rotates, so a busy moment falls on all."""
    k = round_no % len(which)
    return which[k:] + which[:k]

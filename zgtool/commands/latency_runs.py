"""`latency-split --runs K`: the same run K times, then the between-run interval of every figure.

Each run is a whole latency-split (its own rounds, its own within-run intervals). With `-o FILE`,
run k is written to FILE's stem + `-run{k}` + suffix and FILE itself holds the `compare` result over
the K runs; without `-o` the runs go to a temporary folder that is removed afterwards. The
between-run table is `zgtool compare`'s (zgtool/compare): the t-interval over the runs' medians.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from zgtool.errors import UsageError


def run_paths(out: Path | None, runs: int, folder: Path) -> list[Path]:
    base = out if out is not None else folder / "latency-split.json"
    return [base.with_name(f"{base.stem}-run{k}{base.suffix or '.json'}") for k in range(1, runs + 1)]


def run_repeated(opts: Any, runs: int, run_once: Callable[[Any], dict]) -> dict:
    """Call run_once K times with -o pointing at each run's file, then compare them."""
    from zgtool.commands.compare import CompareOptions
    from zgtool.commands.compare import run as compare
    from zgtool.output import err_console

    if runs < 2:
        raise UsageError(f"--runs must be >= 2 to give a between-run interval, not {runs}")
    if getattr(opts, "sweep", None) is not None:
        raise UsageError("--runs repeats one run; a sweep (-c 1,4,16 / --rate ...) cannot be repeated that way")
    with tempfile.TemporaryDirectory(prefix="zgtool-runs-") as tmp:
        paths = run_paths(opts.out, runs, Path(tmp))
        for k, path in enumerate(paths, 1):
            # each run's own tables are in its file; stderr gets its verdict line, stdout the comparison
            buffer = io.StringIO()
            with contextlib.redirect_stdout(buffer):
                run_once(dataclasses.replace(opts, out=path, as_json=False))
            first = next((ln for ln in buffer.getvalue().splitlines() if ln.strip()), "")
            err_console.print(f"run {k} of {runs} ({path.name}): {first}", highlight=False, markup=False)
        return compare(CompareOptions(files=tuple(paths), baseline=None, plots_dir=None, summary_md=None,
                                      as_json=opts.as_json, out=opts.out, fail_on_regression=False))

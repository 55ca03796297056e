"""Read latency-split (or k6 bench) result files and check they measured the same thing.

Runs are compared path by path *by position* (the first target of every run is path 1, ...): the
same stack measured on different nights usually has the same URLs, but `verify` and tests start
their servers on free ports, so names are labels, not keys. Two runs differ in what they measured
when the workload does (stream, prompt, output length, concurrency, dataset, open-loop rate) or
when they have a different number of paths: `compare` then refuses with one line naming the
difference (exit 2), because a between-run interval over different workloads means nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from zgtool.errors import UsageError
from zgtool.results import load_result

KIND = "latency_split"
BENCH_KIND = "bench.k6"
# config fields that define the workload: a difference in any of them makes runs incomparable
WORKLOAD_FIELDS = ("stream", "prompt", "prompt_chars", "max_tokens", "concurrency", "new_connection",
                   "workload", "open_loop")
# a k6 bench's: the load and what each request asks (the payload's file differs when its model was detected)
BENCH_WORKLOAD_FIELDS = ("rate_rps", "arrivals", "api", "endpoint", "sequential")


@dataclass(frozen=True)
class Run:
    path: Path
    label: str                       # the file's stem, unique among the runs compared
    created: str
    config: dict[str, Any]
    targets: tuple[dict[str, Any], ...]
    differences: tuple[dict[str, Any], ...]
    kind: str = KIND
    pairing: str = "paired within each run"     # a bench's: how its differences were measured, in words

    @property
    def path_names(self) -> tuple[str, ...]:
        return tuple(str(t.get("name", f"path {i + 1}")) for i, t in enumerate(self.targets))


def load_run(path: Path) -> Run:
    return run_from(path, load_result(path))


def run_from(path: Path, result: dict[str, Any]) -> Run:
    """A loaded result as a run compare reads (`gate --baseline` checks its runs' workloads with it too)."""
    kind = result.get("kind")
    if kind == BENCH_KIND:
        return bench_run(path, result)
    if kind != KIND:
        raise UsageError(f"{path}: compare reads latency-split and bench (k6) results, this one is {kind!r}")
    data = result.get("data") or {}
    targets = data.get("targets")
    if not isinstance(targets, list) or not targets:
        raise UsageError(f"{path}: a latency-split result with no targets")
    return Run(path=path, label=path.stem, created=str(result.get("created", "")),
               config=dict(data.get("config") or {}), targets=tuple(targets),
               differences=tuple(data.get("differences") or ()))


def bench_run(path: Path, result: dict[str, Any]) -> Run:
    """A k6 bench as compare's paths (zgtool.loadtest.differences.split_shape): direct first, each scenario's
    median duration as total_ms with that median's interval, and each scenario's p50 difference from direct
    (paired by the scenarios' turns, or unpaired for a bench run in one turn) as its hop's total_ms tax."""
    from zgtool.loadtest.differences import how_paired, split_shape

    data = result.get("data") or {}
    if not isinstance(data.get("scenarios"), dict) or not data["scenarios"]:
        raise UsageError(f"{path}: a bench result with no scenarios")
    targets, differences = split_shape(data, "total_ms")
    config = {k: (data.get("config") or {}).get(k) for k in BENCH_WORKLOAD_FIELDS}
    return Run(path=path, label=path.stem, created=str(result.get("created", "")), config=config,
               targets=tuple(targets), differences=tuple(differences), kind=BENCH_KIND,
               pairing=how_paired(data.get("differences") or {}))


def _unique_labels(runs: list[Run]) -> list[Run]:
    seen: dict[str, int] = {}
    out = []
    for run in runs:
        n = seen.get(run.label, 0)
        seen[run.label] = n + 1
        if n:
            run = Run(run.path, f"{run.label}#{n + 1}", run.created, run.config, run.targets, run.differences,
                      run.kind, run.pairing)
        out.append(run)
    return out


def check_comparable(runs: list[Run]) -> None:
    """UsageError naming the first difference that makes the runs incomparable."""
    first = runs[0]
    for run in runs[1:]:
        if run.kind != first.kind:
            raise UsageError(f"{run.path} is a {run.kind} result and {first.path} a {first.kind} one: compare "
                             "reads runs of one kind")
        if len(run.targets) != len(first.targets):
            raise UsageError(f"{run.path} measured {len(run.targets)} path(s), {first.path} {len(first.targets)}: "
                             "compare needs the same paths in every run")
        if run.kind == BENCH_KIND and run.path_names != first.path_names:
            raise UsageError(f"{run.path} ran the scenarios {', '.join(run.path_names)} and {first.path} "
                             f"{', '.join(first.path_names)}: compare needs the same scenarios in every run")
        check_same_workload(first, run)


def check_same_workload(first: Run, run: Run) -> None:
    """UsageError when two runs of one kind measured different workloads: the config fields that define one,
    and each path's API and model (`gate --baseline` checks this alone: its runs may hold different paths)."""
    for field in (BENCH_WORKLOAD_FIELDS if run.kind == BENCH_KIND else WORKLOAD_FIELDS):
        a, b = first.config.get(field), run.config.get(field)
        if a != b:
            raise UsageError(f"{run.path} and {first.path} measured different workloads: "
                             f"{field} is {b!r} there and {a!r} here")
    if run.kind == KIND:
        _same_routes(first, run)


def _same_routes(first: Run, run: Run) -> None:
    """Each path asked the same API and model in both runs: a gateway's Messages route and its chat completions
    route are different code (LiteLLM's headers came 20 vs 79 ms into a stream of the same engine), and a
    detection that picked another API or model between two runs measured another workload."""
    for i, (a, b) in enumerate(zip(first.targets, run.targets, strict=False)):
        for what, x, y in (("api", a.get("api"), b.get("api")),
                           ("model", (a.get("detected") or {}).get("model"), (b.get("detected") or {}).get("model"))):
            if x is not None and y is not None and x != y:
                raise UsageError(f"{run.path} and {first.path} measured different workloads: path {i + 1}'s {what} "
                                 f"is {y!r} there and {x!r} here (pass --api/--model to measure the same)")


def load_runs(paths: list[Path], baseline: Path | None) -> list[Run]:
    """The runs in order, the baseline first (the first file when --baseline is not given)."""
    if len(paths) + (baseline is not None and baseline not in paths) < 2:
        raise UsageError("compare needs at least two result files")
    ordered = list(paths)
    if baseline is not None:
        ordered = [baseline] + [p for p in paths if p.resolve() != baseline.resolve()]
    runs = _unique_labels([load_run(p) for p in ordered])
    check_comparable(runs)
    return runs

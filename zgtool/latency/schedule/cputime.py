"""CPU time of local processes around each measured block: what a co-located gateway costs in CPU.

On one host the gateway's processes compete with the engine for the same cores; the engine's
phases then run slower on the gateway path although the gateway adds no latency of its own to
them. Reading each process group's CPU time before and after every block gives the CPU ms per
request each part spent, so that contention is named for what it is.

Per-thread `schedstat` (nanoseconds of run time) where the kernel has it, else utime+stime from
`/proc/PID/stat` in clock ticks. Linux only; elsewhere nothing is reported.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

PROC = Path("/proc")


def available() -> bool:
    return (PROC / "self" / "stat").is_file()


def _stat_fields(pid: int) -> list[str] | None:
    try:
        text = (PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    # the command name may contain spaces and parentheses: split after the last ')'
    return text.rsplit(")", 1)[1].split()


def group_members(pgid: int) -> list[int]:
    """Every live process whose process group is `pgid` (the leader and e.g. nginx's workers)."""
    out = []
    for entry in PROC.iterdir():
        if not entry.name.isdigit():
            continue
        f = _stat_fields(int(entry.name))
        # after the name: state, ppid, pgrp, session, ...
        if f is not None and len(f) > 2 and f[0] != "Z" and int(f[2]) == pgid:
            out.append(int(entry.name))
    return out


def tree_members(pid: int) -> list[int]:
    """`pid` and every live descendant of it."""
    children: dict[int, list[int]] = {}
    for entry in PROC.iterdir():
        if entry.name.isdigit():
            f = _stat_fields(int(entry.name))
            if f is not None and len(f) > 1 and f[0] != "Z":
                children.setdefault(int(f[1]), []).append(int(entry.name))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(children.get(p, ()))
    return out


def members(pid: int) -> list[int]:
    """The processes a part's CPU is read from: the whole process group when `pid` leads one (zgtool
    starts every server that way: nginx's master and workers), else `pid` and its children — never
    the group of a process that merely belongs to one (a shell job's group would hold the client)."""
    try:
        leader = os.getpgid(pid) == pid
    except OSError:
        # no such process: it may still name a group whose leader has exited (a shell's job)
        return group_members(pid)
    return group_members(pid) if leader else tree_members(pid)


def process_cpu_ns(pid: int) -> int:
    """CPU time a live process has used so far, in ns (0 when it is gone)."""
    total = 0
    found = False
    try:
        tasks = list((PROC / str(pid) / "task").iterdir())
    except OSError:
        tasks = []
    for task in tasks:
        try:
            total += int((task / "schedstat").read_text().split()[0])
            found = True
        except (OSError, ValueError, IndexError):
            continue
    if found:
        return total
    f = _stat_fields(pid)
    if f is None or len(f) < 13:
        return 0
    tick_ns = 1_000_000_000 // os.sysconf("SC_CLK_TCK")
    return (int(f[11]) + int(f[12])) * tick_ns     # utime, stime


def group_cpu_ns(pid: int) -> int:
    return sum(process_cpu_ns(p) for p in members(pid))


@dataclass
class CpuWatch:
    """CPU time per named process group, accumulated per measured target.

    `groups` maps a part's name ("engine", "pygw", "nginx") to a pid: its process group when it
    leads one (zgtool's supervisor starts every child in its own session), else it and its children. Call begin() before a block and end(target, requests) after it.
    """

    groups: Mapping[str, int]
    cpu_ns: dict[str, dict[str, int]] = field(default_factory=dict)     # target -> part -> ns
    requests: dict[str, int] = field(default_factory=dict)              # target -> requests measured
    _mark: dict[str, int] = field(default_factory=dict)

    def read(self) -> dict[str, int]:
        return {name: group_cpu_ns(pid) for name, pid in self.groups.items()}

    def begin(self) -> None:
        self._mark = self.read()

    def end(self, target: str, requests: int) -> None:
        now = self.read()
        per = self.cpu_ns.setdefault(target, {})
        for name, ns in now.items():
            # a process that exited between the reads takes its time with it: never negative
            per[name] = per.get(name, 0) + max(0, ns - self._mark.get(name, ns))
        self.requests[target] = self.requests.get(target, 0) + requests

    def per_request_ms(self) -> dict[str, dict[str, float]]:
        """target -> part -> CPU ms per measured request."""
        out: dict[str, dict[str, float]] = {}
        for target, parts in self.cpu_ns.items():
            n = self.requests.get(target, 0)
            if n:
                out[target] = {name: ns / 1e6 / n for name, ns in parts.items()}
        return out

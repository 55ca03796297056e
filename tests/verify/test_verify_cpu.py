"""Co-location: verify's latency stage reads each local gateway process's CPU time per block."""

from __future__ import annotations

from pathlib import Path

from zgtool.gateway.supervisor import LocalStack, StackConfig
from zgtool.latency.schedule.cputime import CpuWatch, group_cpu_ns, group_members
from zgtool.report.verdict import taxes
from zgtool.targets import Target
from zgtool.verify.plan import Plan, SplitRun, VerifyConfig
from zgtool.verify.stages import latency_split


def test_a_real_stack_reports_cpu_ms_per_request_for_every_gateway_process(tmp_path: Path) -> None:
    with LocalStack(StackConfig(model="null", paths=("stack",), run_dir=tmp_path / "run")) as st:
        groups = {c.name: c.pid for c in st.children if c.pid is not None}
        assert {"engine", "pygw", "nginx"} <= set(groups)
        # nginx's workers live in the master's process group and are counted with it
        assert len(group_members(groups["nginx"])) >= 2
        targets = [Target("direct", st.urls["direct"]), Target("stack", st.urls["stack"])]
        plan = Plan.for_config(VerifyConfig(model="null", quick=True, requests=12, concurrency=(1,)))
        result = latency_split(targets, SplitRun("nonstream-c1", False, 1, 12), plan,
                               VerifyConfig(model="null", quick=True), groups)
    direct, stack = result["data"]["targets"]
    assert stack["cpu_ms_per_request"]["pygw"] > 0 and stack["cpu_ms_per_request"]["nginx"] > 0
    assert stack["cpu_ms_per_request"]["engine"] > 0 and direct["cpu_ms_per_request"]["engine"] > 0
    # pygw's work on the gateway path dwarfs its idle time while the direct path ran
    assert stack["cpu_ms_per_request"]["pygw"] > direct["cpu_ms_per_request"]["pygw"]
    row = taxes(result)[0]
    assert row.gateway_cpu_ms is not None and row.gateway_cpu_ms > 0
    assert row.indicative and row.engine_cpu_ms is not None and set(row.engine_cpu_ms) == {"direct", "stack"}


def test_cpu_watch_accumulates_per_target_and_never_goes_negative() -> None:
    import os

    me = os.getpgid(0)
    watch = CpuWatch({"self": me})
    watch.begin()
    x = 0
    for i in range(300_000):   # burn some CPU in this process group
        x += i * i
    watch.end("a", 3)
    assert watch.per_request_ms()["a"]["self"] > 0
    assert group_cpu_ns(me) > 0
    gone = CpuWatch({"gone": 2**22 + 12345})    # no such process group: zero, not an error
    gone.begin()
    gone.end("b", 1)
    assert gone.per_request_ms() == {"b": {"gone": 0.0}}


def test_a_pid_that_does_not_lead_its_group_counts_only_itself_and_its_children() -> None:
    """A server started from a shell job shares the job's group with the client measuring it:
    `--cpu-pid engine=PID` must read the server and its children, never the client's CPU too."""
    import contextlib
    import os
    import subprocess
    import sys
    import time

    from zgtool.commands.latency_options import cpu_groups as _cpu_groups
    from zgtool.latency.schedule.cputime import members

    # a parent (not a group leader: it shares this test's group) with one child that burns CPU
    code = ("import subprocess,sys; c=subprocess.Popen([sys.executable,'-c','while True: pass']); "
            "print(c.pid, flush=True); c.wait()")
    parent = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        child = int(parent.stdout.readline()) if parent.stdout else 0
        assert os.getpgid(parent.pid) == os.getpgid(0) != parent.pid
        groups = _cpu_groups([f"engine={parent.pid}"])
        assert groups == {"engine": parent.pid}
        assert set(members(groups["engine"])) == {parent.pid, child}      # not this process
        before = group_cpu_ns(parent.pid)
        deadline = time.monotonic() + 30
        while group_cpu_ns(parent.pid) - before < 10_000_000:           # the child's CPU is counted
            assert time.monotonic() < deadline, "the child's CPU never showed up"
            time.sleep(0.01)
    finally:
        for p in members(parent.pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(p, 9)
        parent.wait(timeout=10)

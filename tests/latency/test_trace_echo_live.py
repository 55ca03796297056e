"""Trace context per hop from the engine's echo (issue 38 item 3): zgtool's engine answers with the trace id of the
traceparent it received (x-zgtool-trace-id, engine/server/tracing.py); latency-split compares it with the one it
sent on that request. Live: the real engine direct, through zgtool's nginx and pygw (both forward traceparent:
survived), and through the delay hop (bench/peerlib/delayhop.py) rewriting it (rewritten) or stripping it
(dropped); the verdict is a row of each path's table in the terminal, and targets[].trace_echo in the JSON."""

from __future__ import annotations

import io
import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from zgtool.latency.analysis.phases import analyse
from zgtool.latency.config import SplitConfig
from zgtool.latency.render.split import render
from zgtool.latency.result import result_data
from zgtool.latency.schedule.runner import measure_targets
from zgtool.targets import Target

pytestmark = pytest.mark.slow

HOP = Path(__file__).resolve().parents[2] / "bench" / "peerlib"


@pytest.fixture(scope="module")
def paths() -> Iterator[dict[str, str]]:
    import sys

    from zgtool.errors import ZgError
    from zgtool.gateway.supervisor import LocalStack, StackConfig

    sys.path.insert(0, str(HOP))
    from delayhop import start_hop  # type: ignore[import-not-found]

    try:
        stack = LocalStack(StackConfig(model="null", paths=("nginx", "pygw")))
        st = stack.__enter__()
    except ZgError as exc:
        pytest.fail(f"the local stack did not start: {exc.message}")
    procs: list[subprocess.Popen[Any]] = []
    try:
        urls = dict(st.urls)
        urls["rewriter"] = start_hop(urls["direct"], 0.0, "head", None, procs, traceparent="rewrite").url
        urls["stripper"] = start_hop(urls["direct"], 0.0, "head", None, procs, traceparent="strip").url
        yield urls
    finally:
        for p in procs:
            p.terminate()
            p.wait(timeout=10)
        stack.__exit__(None, None, None)
        sys.path.remove(str(HOP))


def test_each_hops_trace_context_is_judged_from_the_engines_echo(paths: dict[str, str]) -> None:
    names = ["direct", "nginx", "pygw", "rewriter", "stripper"]
    cfg = SplitConfig(num_requests=8, stream=False, max_tokens=4, warmup=1, resamples=200)
    targets = [Target(k, paths[k]) for k in names]
    samples = measure_targets(targets, cfg)
    for name, per in zip(names, samples, strict=True):
        assert all(s.ok for s in per), (name, [s.error for s in per])
    res = analyse(targets, samples, cfg)
    got = {t.name: t.trace_echo for t in res.targets}
    assert all(got[n] is not None and got[n]["sent"] == 8 for n in names), got
    assert {n: got[n]["verdict"] for n in names} == {          # type: ignore[index]
        "direct": "survived", "nginx": "survived", "pygw": "survived", "rewriter": "rewritten",
        "stripper": "dropped"}, got
    assert got["rewriter"] == {"verdict": "rewritten", "survived": 0, "rewritten": 8, "dropped": 0, "sent": 8,
                               "source": "engine echo (x-zgtool-trace-id)"}
    data = json.loads(json.dumps(result_data(res), default=str))
    assert [t["trace_echo"]["verdict"] for t in data["targets"]] == [
        "survived", "survived", "survived", "rewritten", "dropped"]
    assert all(s["trace_echo"] == s["trace_id"] for s in data["targets"][1]["samples"] if s["ok"])
    buf = io.StringIO()
    render(res, Console(file=buf, width=200, color_system=None))
    rows = [" ".join(line.split()) for line in buf.getvalue().splitlines() if "trace context" in line]
    assert rows == ["trace context survived (echo) 8"] * 3 + ["trace context rewritten (echo) 8",
                                                            "trace context dropped (echo) 8"], rows

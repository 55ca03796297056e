"""The four first-byte/first-token points of a stream, on crafted streams from a real local server that
writes one piece per loopback segment and says when it sent each (sse_script_server.py).

Each point must land on its piece: at or after that piece was sent and before the next one was. Pieces
are GAP_MS apart, so a client that reads each as it comes has them apart; a figure the client could not
vouch for (it read several pieces late in one read: samples[].unvouched) is not judged here."""

from __future__ import annotations

import contextlib
import json
import subprocess
from collections.abc import Iterator
from dataclasses import asdict

import pytest
from replay_servers import sse_script_server

from zgtool.latency.analysis.phases import analyse
from zgtool.latency.config import SplitConfig
from zgtool.latency.records import RequestSample
from zgtool.latency.wire import pktclock
from zgtool.latency.wire.client import Endpoint, Session
from zgtool.targets import Target

TRIES = 3

# script -> piece index (1-based after the head) of: first body byte, first token of any kind, first content
EXPECTED: dict[str, tuple[str, int, int | None, int | None]] = {
    "role_first": ("openai", 1, 2, 2),
    "empty_content": ("openai", 1, 3, 3),
    "reasoning_first": ("openai", 1, 2, 4),
    "tool_only": ("openai", 1, 2, None),
    "keepalive_first": ("openai", 1, 4, 4),
    "anthropic_ping": ("anthropic", 1, 4, 4),
    "anthropic_thinking_tool": ("anthropic", 1, 3, None),
}


@pytest.fixture(scope="module")
def server() -> Iterator[tuple[str, subprocess.Popen[str]]]:
    with sse_script_server(3) as running_server:
        yield running_server


def _run(server: tuple[str, subprocess.Popen[str]], name: str, api: str,
         clock: str = "socket") -> list[tuple[RequestSample, list[int]]]:
    """TRIES requests of script `name`; clock "packet" runs them under the packet clock (each point timed by
    its own segment's kernel time, as latency-split does with CAP_NET_RAW), "socket" without it."""
    url, proc = server
    cfg = SplitConfig(num_requests=TRIES, warmup=0, stream=True, max_tokens=8, resamples=100)
    session = Session(Endpoint.build(Target(name, f"{url}/s/{name}/v1", api=api), cfg), cfg, None)
    out = []
    with contextlib.ExitStack() as stack:
        if clock == "packet":
            why = stack.enter_context(pktclock.running([int(url.rsplit(":", 1)[1])]))
            if why is not None:
                pytest.skip(f"no packet clock here: {why}")
        try:
            for i in range(TRIES):
                sample = session.measure(i, 0, i, 0)          # t_run0 = 0: start_s is the request's own clock
                line = proc.stdout.readline() if proc.stdout else ""
                assert line.startswith(f"SENT {name} "), line
                out.append((sample, json.loads(line.split(" ", 2)[2])))
        finally:
            session.close()
    if clock == "packet":
        assert all(s.rx_clock == "packet" for s, _ in out), [s.rx_clock for s, _ in out]
    return out


def _piece(at_ns: float, sent: list[int]) -> int | None:
    """Which write a receive time belongs to: sent[k] <= t < sent[k + 1]."""
    for k in range(len(sent)):
        if sent[k] <= at_ns and (k + 1 == len(sent) or at_ns < sent[k + 1]):
            return k
    return None


@pytest.mark.parametrize("clock", ["socket", "packet"])
@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_each_point_lands_on_its_piece(server: tuple[str, subprocess.Popen[str]], name: str, clock: str) -> None:
    """With either clock; under the packet clock the head's end is its blank line's segment, not the segment of
    the first chunk's size line (a chunked answer's head and first event apart: vLLM's stream sends its head
    at once and its first event with the first token)."""
    api, body, any_token, content = EXPECTED[name]
    runs = _run(server, name, api, clock)
    want = {"ttfb_ms": 0, "ttfb_headers_ms": 0, "ttfb_body_ms": body, "ttft_any_ms": any_token, "ttft_ms": content}
    judged = dict.fromkeys(want, 0)
    for s, sent in runs:
        assert s.ok, (s.error, s.error_detail)
        assert (s.ttft_ms is None) == (content is None) and s.ttft_any_ms is not None
        t0 = s.start_s * 1e9
        out = t0 + (s.first_byte_out_ms or 0.0) * 1e6
        at = {"ttfb_ms": out, "ttfb_headers_ms": out, "ttfb_body_ms": out, "ttft_any_ms": t0, "ttft_ms": t0}
        for figure, piece in want.items():
            value = getattr(s, figure)
            if value is None or figure in s.unvouched:
                continue
            judged[figure] += 1
            assert _piece(at[figure] + value * 1e6, sent) == piece, (figure, value, s.unvouched, s.client_lag_ms)
    assert all(judged[f] for f, piece in want.items() if piece is not None), (
        f"the client vouched for no request's figure of {name}: {judged}")


def test_points_reach_the_json_samples_and_the_phase_stats(server: tuple[str, subprocess.Popen[str]]) -> None:
    cfg = SplitConfig(num_requests=TRIES, warmup=0, stream=True, max_tokens=8, resamples=100)
    tool = [s for s, _ in _run(server, "tool_only", "openai")]
    doc = asdict(tool[0])
    assert {"ttfb_ms", "ttfb_headers_ms", "ttfb_body_ms", "ttft_any_ms", "ttft_ms", "client_lag_ms",
            "unvouched"} <= set(doc)
    res = analyse([Target("tool", "http://127.0.0.1:1", api="openai")], [tool], cfg)
    names = {p.name for p in res.targets[0].phases}
    for figure in ("ttfb_headers_ms", "ttfb_body_ms", "ttft_any_ms"):
        assert (figure in names) == any(figure not in s.unvouched for s in tool), figure
    assert "ttft_ms" not in names                    # a tool call only: no content token, no ttft
    assert {"ttft_any_ms", "ttfb_body_ms"} <= set(res.metric_phases) and set(res.definitions) >= {
        "ttfb_headers_ms", "ttfb_body_ms", "ttft_any_ms", "client_lag_ms"}


def test_unvouched_figures_are_left_out_of_their_stats_and_lagged_requests_counted() -> None:
    cfg = SplitConfig(num_requests=4, warmup=0, stream=True, resamples=100)
    samples = [RequestSample(index=i, worker=0, round=i, ok=True, ttfb_ms=1.0 + 100 * (i == 3), ttft_ms=2.0,
                             total_ms=5.0, lagged=i == 3, client_lag_ms=0.5 if i == 3 else 0.0,
                             unvouched=["ttfb_ms"] if i == 3 else []) for i in range(4)]
    res = analyse([Target("t", "http://127.0.0.1:1", api="openai")], [samples], cfg)
    tr = res.targets[0]
    phases = {p.name: p for p in tr.phases}
    assert tr.num_lagged == 1
    assert phases["ttfb_ms"].count == 3 and phases["ttfb_ms"].summary["max"] == 1.0
    assert phases["ttft_ms"].count == 4              # its vouched figures stay
    assert phases["total_ms"].count == 4


def test_a_client_that_keeps_up_is_rarely_flagged(server: tuple[str, subprocess.Popen[str]]) -> None:
    """Pieces GAP_MS apart, read as they come: each read is one segment, so under 10% of requests may be
    flagged (the old rule flagged any read that overlapped the next segment's arrival, and every
    merged read even when the first token ended it)."""
    url, proc = server
    n = 20
    cfg = SplitConfig(num_requests=n, warmup=0, stream=True, max_tokens=8, resamples=100)
    session = Session(Endpoint.build(Target("r", f"{url}/s/role_first/v1", api="openai"), cfg), cfg, None)
    try:
        samples = []
        for i in range(n):
            samples.append(session.measure(i, 0, i, 0))
            assert (proc.stdout.readline() if proc.stdout else "").startswith("SENT role_first ")
    finally:
        session.close()
    assert all(s.ok for s in samples)
    flagged = [s.client_lag_ms for s in samples if s.lagged]
    assert len(flagged) < 0.1 * n, flagged

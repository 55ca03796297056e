"""Two figures of one per-path table from different subsets of requests are said to be so (issue 38 item 4): in
one vLLM run nginx's TTFB p50 (7,880 ms) exceeded its total p50 (6,926 ms) because TTFB was kept for some
requests only, and nothing said. The footnote names the counts, in the terminal and in the JSON."""

from __future__ import annotations

import io
import json

from rich.console import Console

from zgtool.latency.analysis.phases import analyse
from zgtool.latency.config import SplitConfig
from zgtool.latency.records import RequestSample
from zgtool.latency.render.split import render
from zgtool.latency.result import result_data
from zgtool.targets import Target


def _path(unvouched: int) -> list[RequestSample]:
    """30 requests: the slow ones' TTFB kept, the fast ones' (the first `unvouched`) left out, so the TTFB p50
    rests on the slow ones and exceeds the total p50 over all 30."""
    out = []
    for i in range(30):
        total = 6900.0 + 40.0 * i if i < 15 else 8000.0 + 10.0 * i
        s = RequestSample(index=i, worker=0, round=i % 3, ok=True, ttfb_ms=total - 100.0, total_ms=total)
        if i < unvouched:
            s.unvouched = ["ttfb_ms"]
        out.append(s)
    return out


def test_figures_from_different_subsets_are_footnoted_with_their_counts() -> None:
    cfg = SplitConfig(num_requests=30, stream=False, resamples=200)
    targets = [Target("direct", "http://127.0.0.1:1"), Target("nginx", "http://127.0.0.1:2")]
    res = analyse(targets, [_path(0), _path(8)], cfg)
    direct, nginx = res.targets
    p50 = {p.name: p.summary["p50"] for p in nginx.phases}
    assert p50["ttfb_ms"] > p50["total_ms"]                          # the contradiction the footnote explains
    assert direct.subsets is None                                    # every figure on all 30: nothing to say
    assert nginx.subsets == {"of": 30, "kept": {"ttfb_ms": 22, "total_ms": 30}}
    data = json.loads(json.dumps(result_data(res), default=str))
    assert data["targets"][1]["subsets"] == {"of": 30, "kept": {"ttfb_ms": 22, "total_ms": 30}}
    buf = io.StringIO()
    render(res, Console(file=buf, width=160, color_system=None))
    text = " ".join(buf.getvalue().split())
    assert "nginx: figures from different subsets of requests (TTFB 22 of 30, total (E2E) 30 of 30)" in text, text
    assert "direct: figures from different subsets" not in text

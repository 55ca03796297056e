"""Human output at 80 columns: the latency-split tables, gate output, `dcgm watch` and the serve
banner keep every line within 80 characters, use short path names with a legend, intervals as
`[lo, hi]`, and show no Python reprs (`None`, `{'...`)."""

from __future__ import annotations

import random
import re
from pathlib import Path

from rich.console import Console

from zgtool.latency.analysis.phases import analyse
from zgtool.latency.config import SplitConfig
from zgtool.latency.records import RequestSample, SplitResult
from zgtool.targets import Target

DATA = Path(__file__).parent.parent / "report" / "data"


def render_text(renderable: object, width: int = 80) -> str:
    console = Console(width=width, record=True, force_terminal=False, color_system=None)
    with console.capture() as cap:
        console.print(renderable)
    return cap.get()


def assert_readable(text: str, width: int = 80) -> None:
    lines = text.splitlines()
    assert lines
    assert max(len(ln) for ln in lines) <= width, max(lines, key=len)
    assert "None" not in text and "{'" not in text and "http://127.0.0.1…" not in text, text


def split_result(names: tuple[str, ...], stream: bool = True, n: int = 30) -> SplitResult:
    rnd = random.Random(1)
    cfg = SplitConfig(num_requests=n, stream=stream, resamples=200, rounds=3)
    targets = [Target(name=u, url=(u if "://" in u else "http://127.0.0.1:9") + "/v1/messages") for u in names]
    samples = []
    for k, _ in enumerate(targets):
        per = []
        for i in range(n):
            total = 10 + 1.5 * k + rnd.random()
            timing = {"queue": 0.1, "prefill": 2.0, "decode": total - 4, "detok": 0.05, "total": total - 1.5}
            if k:
                timing.update({"gw_auth": 0.2, "gw_total": 1.0})
            per.append(RequestSample(index=i, worker=0, round=i % 3, ok=i != 4, status=200,
                                     error=None if i != 4 else "timeout", send_ms=0.05, ttfb_ms=total * 0.3,
                                     ttft_ms=total * 0.3 if stream else None, total_ms=total,
                                     tpot_ms=0.5 if stream else None, itl_ms=[0.5, 0.6] if stream else [],
                                     output_tokens=16, input_tokens=8, content_events=16, server_timing=timing))
        samples.append(per)
    return analyse(targets, samples, cfg)


def render_split(res: SplitResult) -> str:
    from zgtool.latency.render.split import render

    console = Console(width=80, record=True, force_terminal=False, color_system=None)
    with console.capture() as cap:
        render(res, console)
    return cap.get()


def test_latency_split_with_url_targets_uses_letters_and_a_legend_at_80_columns():
    urls = ("http://127.0.0.1:41234", "http://127.0.0.1:41999")
    for stream in (True, False):
        text = render_split(split_result(urls, stream=stream))
        assert_readable(text)
        assert "A = http://127.0.0.1:41234" in text and "B = http://127.0.0.1:41999" in text
        # no Rich markup leaks into the tables (intervals printed as [lo, hi] by the join are data)
        assert "B - A" in text and "±" not in text and re.search(r"[+-]\d+\.\d\d \[[+-]\d", text)
        assert not re.search(r"\[/?(bold|dim|red|green|yellow|cyan|italic)[^\]]*\]", text.split("side by side")[1])


def test_latency_split_with_three_paths_fits_80_columns():
    text = render_split(split_result(("direct", "stack", "http://10.0.0.5:8000/v1")))
    assert_readable(text)
    assert "stack - direct" in text and "A - direct" in text and "A = http://10.0.0.5:8000/v1" in text


def test_latency_split_flags_requests_the_client_could_not_vouch_for():
    res = split_result(("direct", "stack"))
    for s in res.targets[1].samples[:3]:
        s.lagged, s.client_lag_ms = True, 1.25
    text = render_split(res)
    assert_readable(text)
    assert "stack: 3 of 29 requests flagged" in text.replace("\n", " ") and "1.25 ms" in text
    assert "direct: " not in text.split("side by side")[1].split("flagged")[0].splitlines()[-1]


def test_latency_split_names_every_phase_in_words():
    text = render_split(split_result(("direct", "stack")))
    assert "outside_engine" not in text and "_ms" not in text
    assert "outside engine" in text and "engine decode" in text
    # n.s. appears only as the significance marker after an interval (issue 33), never as a phase's word
    assert all(ln.split("n.s.")[0].rstrip().endswith("]") for ln in text.splitlines() if "n.s." in ln
               and "= not significant" not in ln and "n.s. = " not in ln)


def test_gate_output_is_one_block_per_check_at_80_columns():
    from zgtool.gate import LoadedResult, evaluate, load_policy
    from zgtool.gate.render import render_report
    from zgtool.results import load_result

    files = sorted((DATA / "verify").glob("*.json"))
    report = evaluate(load_policy(None), [LoadedResult(str(p), load_result(p)) for p in files])
    console = Console(width=80, record=True, force_terminal=False, color_system=None)
    with console.capture() as cap:
        render_report(report, console)
    text = cap.get()
    assert_readable(text)
    assert "PASS" in text and "bench.k6.json" in text and "tests/report/data/verify/bench" not in text


def _watch_state(readings_per_tick):  # type: ignore[no-untyped-def]
    from zgtool.dcgm.rules import RuleEvaluator, load_rules
    from zgtool.dcgm.watch import WatchConfig, WatchState

    rules = load_rules()
    state = WatchState(source={"kind": "engine", "url": "http://127.0.0.1:8000"}, config=WatchConfig(),
                       rules=rules, evaluator=RuleEvaluator(rules))
    for t, readings in enumerate(readings_per_tick):
        state.add(float(t), readings)
    return state


def test_dcgm_watch_on_a_cpu_engine_hides_the_empty_gpu_columns():
    from zgtool.dcgm.metrics import GpuReading
    from zgtool.dcgm.render import watch_table

    ticks = [[GpuReading(key="engine", metrics={"kv_util_pct": 10.0 + t, "running": 1, "waiting": 0,
                                                 "batch_size": 1})] for t in range(30)]
    text = render_text(watch_table(_watch_state(ticks)))
    assert_readable(text)
    assert "KV %" in text and "util%" not in text and "MHz" not in text and "GiB" not in text


def test_dcgm_watch_of_eight_gpus_fits_80_columns():
    from zgtool.dcgm.metrics import normalise_dcgm, parse_exposition
    from zgtool.dcgm.render import watch_table

    text = (Path(__file__).parent.parent / "dcgm" / "data" / "exporter_49_h100_2gpu.txt").read_text()
    readings = normalise_dcgm(parse_exposition(text))
    out = render_text(watch_table(_watch_state([readings] * 30)))
    assert_readable(out)
    assert "util%" in out and "h100-node-07/gpu0" in out and "71.0/79.6 GiB" in out


def test_serve_banner_fits_80_columns():
    from zgtool.commands.serve_banner import startup_table
    from zgtool.engine.server.config import ServeConfig
    from zgtool.engine.server.run import build

    built = build(ServeConfig(model="null", port=0))
    try:
        text = render_text(startup_table(built))
    finally:
        built.sock.close()
    assert_readable(text)
    assert "listening" in text and "/v1/chat/completions" in text.replace("\n", "")


class _HintedOrigin:
    """A local HTTP answer carrying the engine's ids and load hint (a JSON header)."""

    def __enter__(self) -> str:
        import json
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        class Handler(BaseHTTPRequestHandler):
            def _answer(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                self.rfile.read(length)
                body = json.dumps({"type": "message", "content": [{"type": "text", "text": "hi"}],
                                   "usage": {"input_tokens": 1, "output_tokens": 1}}).encode()
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.send_header("request-id", "inference-7")
                self.send_header("x-gpu-load-hint", json.dumps({"kv_util": 0.0, "running": 0, "waiting": 0}))
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_POST = do_GET = _answer

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


def test_probe_headers_prints_the_load_hint_as_pairs_not_a_python_dict():
    from zgtool.probes.headers import probe_headers
    from zgtool.probes.render import render_headers
    from zgtool.targets import resolve

    with _HintedOrigin() as url:
        result = probe_headers(resolve(url))
    console = Console(width=80, record=True, force_terminal=False, color_system=None)
    with console.capture() as cap:
        render_headers(result, console)
    text = cap.get()
    assert "load hint: kv_util=0.0, running=0, waiting=0" in text
    assert "{'" not in text


def test_a_probe_table_keeps_a_target_url_on_one_line_at_80_columns() -> None:
    # `probe stream` through nginx in front of llama-server folded "http://127.0.0.1:18152/v1/chat/compl" /
    # "etions": its long field names took half the width
    from zgtool.probes.render import _kv

    url = "http://127.0.0.1:18152/v1/chat/completions -> HTTP 200 text/event-stream"
    text = render_text(_kv("probe stream", [("target", url),
                                            ("headers / first body / first content / last content",
                                             "401.994 ms / 402.084 ms / 402.084 ms / 402.084 ms")]))
    assert_readable(text)
    assert "http://127.0.0.1:18152/v1/chat/completions" in text

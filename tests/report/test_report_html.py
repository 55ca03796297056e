"""`zgtool report html`: rendered from recorded results of every kind and from partial sets."""

from __future__ import annotations

import json
import re
import shutil
from html import escape
from pathlib import Path

import pytest

from zgtool.errors import UsageError
from zgtool.report.html import render_files
from zgtool.report.load import collect

ALL_SECTIONS = ("verdict", "waterfall", "recommendations", "cdf", "throughput", "tokens", "stream", "k6", "intermediaries",
                "network", "engine", "percentiles", "environment")
URL = re.compile(r"https?://[^\s\"'<>)]+")


def section(html: str, sid: str) -> str:
    m = re.search(rf'<section id="{sid}">(.*?)</section>', html, re.S)
    assert m, f"section {sid} missing"
    return m.group(1)


def absent(html: str, sid: str) -> str:
    """The one line a section without data gets in the report's closing "Not in this report" list."""
    assert f'<section id="{sid}">' not in html, f"section {sid} rendered without data"
    m = re.search(rf'<li id="absent-{sid}">(.*?)</li>', html, re.S)
    assert m, f"no 'not in this report' line for {sid}"
    return m.group(1)


def measured_strings(paths: list[Path]) -> str:
    """Every string value of the input results, HTML-escaped as the report writes them."""
    out: list[str] = []

    def walk(o: object) -> None:
        if isinstance(o, dict):
            for k, v in o.items():
                out.append(str(k))
                walk(v)
        elif isinstance(o, list):
            for v in o:
                walk(v)
        elif isinstance(o, str):
            out.append(o)
    for p in paths:
        for f in ([p] if p.is_file() else sorted(p.glob("*.json"))):
            walk(json.loads(f.read_text()))
    return "\n".join(out + [escape(s) for s in out])


@pytest.fixture(scope="module")
def every_kind(data_dir: Path) -> list[Path]:
    return [data_dir / "verify", data_dir / "single"]


@pytest.fixture(scope="module")
def full_html(every_kind: list[Path]) -> str:
    return render_files(every_kind, title="every kind")


def test_every_kind_fills_every_section(full_html: str, every_kind: list[Path]) -> None:
    kinds = collect(every_kind).kinds
    for k in ("probe.all", "probe.tcp", "probe.tls", "probe.headers", "probe.stream", "latency_split", "bench.k6",
              "gate", "dcgm.watch", "engine.metrics", "defrag", "verify"):
        assert k in kinds
    for sid in ALL_SECTIONS:
        assert "Not in this report" not in section(full_html, sid), sid
    assert full_html.count("<svg") >= 20


def test_no_url_except_inside_the_measured_data(full_html: str, every_kind: list[Path]) -> None:
    data = measured_strings(every_kind)
    urls = URL.findall(full_html)
    assert urls, "the recorded data holds target URLs; the report should show them"
    own = [u for u in urls if u.rstrip(".,;:") not in data and u not in data]
    assert own == []
    # and nothing the browser would fetch: no src/href to anything but in-page anchors
    assert not re.search(r'(src|href)\s*=\s*"(?!#)', full_html)
    assert "@import" not in full_html and "url(" not in full_html


def test_only_a_k6_result_gives_the_k6_section_and_says_why_the_rest_is_missing(data_dir: Path) -> None:
    html = render_files([data_dir / "verify" / "bench.k6.json"])
    k6 = section(html, "k6")
    assert "Not in this report" not in k6 and "<svg" in k6 and "direct_stream" in k6
    # a result recorded before the p50 differences were kept: no interval is made up
    assert "p50 vs direct" in k6 and "<td class=num>-</td></tr>" in k6
    assert "no latency_split result among the inputs" in absent(html, "waterfall")
    assert "no probe.stream / probe.all result among the inputs" in absent(html, "stream")


def test_the_k6_table_gives_each_path_its_p50_against_direct_with_the_interval(data_dir: Path, tmp_path: Path) -> None:
    doc = json.loads((data_dir / "verify" / "bench.k6.json").read_text())
    doc["data"]["differences"] = {
        "gateway": {"vs": "direct", "p50_ms": 2.5, "lo_ms": 1.25, "hi_ms": 3.75, "n": 40},
        "direct_stream": {"vs": "direct", "p50_ms": 0.5, "lo_ms": -0.25, "hi_ms": 1.0, "n": 40}}
    path = tmp_path / "bench.k6.json"
    path.write_text(json.dumps(doc))
    k6 = section(render_files([path]), "k6")
    assert "<td class=num>+2.50 [+1.25, +3.75]</td>" in k6
    assert "<td class=num>+0.50 [-0.25, +1.00] n.s.</td>" in k6


def test_a_skipped_verify_stage_is_the_reason_its_section_gives(data_dir: Path, tmp_path: Path) -> None:
    verify = json.loads((data_dir / "verify" / "verify.json").read_text())
    for st in verify["data"]["stages"]:
        if st["name"] == "k6":
            st["status"], st["reason"] = "skipped", "k6 is not installed (looked in $ZGTOOL_K6, PATH)"
    (tmp_path / "verify.json").write_text(json.dumps(verify))
    shutil.copy(data_dir / "verify" / "probe.all-direct.json", tmp_path)
    html = render_files([tmp_path])
    assert "k6 skipped: k6 is not installed" in absent(html, "k6")
    assert "Not in this report" not in section(html, "intermediaries")


def test_single_probe_results_fill_tls_and_stream_sections(data_dir: Path) -> None:
    html = render_files([data_dir / "single"])
    net = section(html, "network")
    assert "TLSv1.3" in net and "JA4S" in net and "self" in net.lower()
    stream = section(html, "stream")
    assert "buffering" in stream and "streaming" in stream


def test_a_folder_without_results_is_a_usage_error(tmp_path: Path) -> None:
    (tmp_path / "x.json").write_text('{"not": "a result"}')
    with pytest.raises(UsageError, match="no zgtool result files"):
        collect([tmp_path])


def test_a_named_file_that_is_not_a_result_is_a_usage_error(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text("[1, 2")
    with pytest.raises(UsageError, match="not a JSON result file"):
        collect([bad])


def test_report_opens_in_chromium_without_console_errors(browser, full_html: str, tmp_path: Path) -> None:
    page = tmp_path / "report.html"
    page.write_text(full_html)
    shot = tmp_path / "report.png"
    run = browser(page, shot)
    assert run.console == []
    assert shot.stat().st_size > 20_000 and shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # the inline script ran to its last line (it counts the sections it found)
    assert f'data-ready="{full_html.count("<section id=")}"' in run.dom


def test_the_console_check_catches_a_page_that_throws(browser, tmp_path: Path) -> None:
    page = tmp_path / "broken.html"
    page.write_text("<!DOCTYPE html><html><body><script>throw new Error('boom-zg')</script></body></html>")
    run = browser(page)
    assert any("boom-zg" in line for line in run.console)


def _legend_colours(html: str) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for key, colour in re.findall(r'<g class="lg" data-key="([^"]+)"><rect[^>]*fill="([^"]+)"', html):
        out.setdefault(key, set()).add(colour)
    return out


def test_every_path_keeps_one_colour_in_every_section(full_html: str) -> None:
    colours = _legend_colours(full_html)
    for path in ("direct", "stack"):
        assert len(colours[path]) == 1, (path, colours[path])
    # k6's `gateway` scenario is the stack path; its streaming scenario is a shade of direct's colour
    assert colours["gateway"] == colours["stack"]
    assert colours["direct (stream)"] != colours["direct"]
    path_colours = set().union(*(colours[p] for p in ("direct", "stack")))
    timeline = set().union(*(colours[k] for k in ("running", "waiting", "KV cache use %")))
    assert not path_colours & timeline, "a metric series must not wear a path's colour"


HUMAN_SECTIONS = ("waterfall", "cdf", "tokens", "k6", "engine", "percentiles", "environment", "network")


def _visible_text(fragment: str) -> str:
    fragment = re.sub(r"<(script|style|code)\b.*?</\1>", " ", fragment, flags=re.S)
    return " ".join(re.findall(r">([^<]+)<", fragment))


def test_sections_show_words_not_field_names_or_python_reprs(full_html: str) -> None:
    for sid in HUMAN_SECTIONS:
        text = _visible_text(section(full_html, sid))
        for raw in ("total_ms", "ttft_ms", "decode_ms", "gw_auth_ms", "http_req_duration", "kv_util", "kv_blocks",
                    "None", "{'", "{&#x27;"):
            assert raw not in text, (sid, raw)
    waterfall = _visible_text(section(full_html, "waterfall"))
    assert "engine decode" in waterfall and "gateway auth" in waterfall


def test_environment_shows_the_engine_model_dtype_and_device(data_dir: Path, tmp_path: Path) -> None:
    doc = json.loads((data_dir / "verify" / "latency_split-stream-c1.json").read_text())
    doc["environment"].update({"model": "dummy:small", "dtype": "bfloat16", "device": "cuda:0"})
    (tmp_path / "split.json").write_text(json.dumps(doc))
    env = section(render_files([tmp_path / "split.json"]), "environment")
    for text in ("engine model", "dtype", "device", "dummy:small", "bfloat16", "cuda:0"):
        assert text in env
    # results without them do not grow empty columns
    plain = section(render_files([data_dir / "verify" / "latency_split-stream-c1.json"]), "environment")
    assert "engine model" not in plain and "None" not in plain


MEASURE_CHARTS = """<script>
  var right = 0;
  document.querySelectorAll('svg.chart').forEach(function(s){ right = Math.max(right, s.getBoundingClientRect().right); });
  document.body.setAttribute('data-svg-right', String(Math.ceil(right)));
</script></body>"""
# headless Chromium will not open a window narrower than 500 px: the page itself is held to 420
NARROW = "<style>html,body{width:420px;max-width:420px}</style></head>"


def test_every_chart_fits_a_420px_screen(browser, full_html: str, tmp_path: Path) -> None:
    assert full_html.count('<svg class="chart" viewBox=') == full_html.count("<svg")
    page = tmp_path / "narrow.html"
    page.write_text(full_html.replace("</head>", NARROW, 1).replace("</body>", MEASURE_CHARTS, 1))
    run = browser(page, width=500)
    right = int(re.search(r'data-svg-right="(\d+)"', run.dom).group(1))
    assert 0 < right <= 420, right


def test_throughput_section_shows_rates_goodput_at_the_slo_and_cpu_per_request(data_dir: Path) -> None:
    rec = data_dir / "split" / "latency_split-slo.json"
    doc = json.loads(rec.read_text())
    html = section(render_files([rec], title="slo"), "throughput")
    for t in doc["data"]["targets"]:
        tp = t["throughput"]
        assert f'<td class=num>{tp["request_rps"]:.2f}</td>' in html
        assert f'<td class=num>{tp["output_tok_s"]:.1f}</td>' in html
        assert f'{tp["goodput_rps"]:.2f} ({tp["good_requests"]}/{tp["requests_ok"]})' in html
        assert f'engine {t["cpu_ms_per_request"]["engine"]:.2f}' in html
    assert "ttft ≤ 5 ms" in html and "e2e ≤ 20 ms" in html


def test_a_breached_gate_stage_is_red_not_green_or_grey(data_dir: Path, tmp_path: Path) -> None:
    shutil.copytree(data_dir / "verify", tmp_path / "v")
    vf = tmp_path / "v" / "verify.json"
    doc = json.loads(vf.read_text())
    gate = next(s for s in doc["data"]["stages"] if s["name"] == "gate")
    gate.update(status="breached", reason="1 check(s) breached")
    vf.write_text(json.dumps(doc))
    html = render_files([tmp_path / "v"], title="breached")
    row = re.search(r'<tr><td><span class="badge (\w+)">breached</span></td>', html)
    assert row and row.group(1) == "bad"


MEASURE_NARROW = """<script>
  var small = 99, where = '';
  document.querySelectorAll('svg.chart').forEach(function(s){
    var box = s.getBoundingClientRect();
    if (!box.width) { return; }                       // the drawing for the other screen size
    var scale = box.width / s.viewBox.baseVal.width;
    s.querySelectorAll('text').forEach(function(t){
      var px = parseFloat(getComputedStyle(t).fontSize) * scale;
      if (px < small) { small = px; where = t.textContent; }
    });
  });
  document.body.setAttribute('data-body-scroll', String(document.body.scrollWidth));
  document.body.setAttribute('data-min-font', small.toFixed(2));
  document.body.setAttribute('data-min-font-text', where);
</script></body>"""


def test_at_420px_nothing_overflows_the_page_and_chart_text_stays_legible(browser, full_html: str,
                                                                          tmp_path: Path) -> None:
    # the gate table and every other table scroll inside their own box; the page itself never does
    assert '<div class="wide"><table class="t"><thead><tr><th>status</th><th>rule</th>' in full_html
    page = tmp_path / "narrow.html"
    page.write_text(full_html.replace("</head>", NARROW, 1).replace("</body>", MEASURE_NARROW, 1))
    run = browser(page, width=500)
    scroll = int(re.search(r'data-body-scroll="(\d+)"', run.dom).group(1))
    assert scroll <= 420, scroll
    font = float(re.search(r'data-min-font="([\d.]+)"', run.dom).group(1))
    assert font >= 9.0, (font, re.search(r'data-min-font-text="([^"]*)"', run.dom).group(1))


def test_each_chart_is_drawn_for_wide_and_narrow_screens_with_fewer_ticks_when_narrow() -> None:
    from zgtool.report import svg

    html = svg.line_chart([svg.Series("a", [0.0, 1000.0, 2000.0, 3000.0], [0.0, 50.0, 80.0, 100.0], "#000")],
                          x_label="ms", y_label="%")
    wide, narrow = re.match(r'<div class="cw">(.*)</div><div class="cn">(.*)</div>$', html).groups()
    assert 'viewBox="0 0 620 ' in wide and f'viewBox="0 0 {svg.NARROW_WIDTH} ' in narrow
    assert narrow.count('class="tick"') < wide.count('class="tick"')


def test_throughput_section_shows_each_paths_prefix_cache_hit_rate_when_it_was_read(data_dir: Path,
                                                                                    tmp_path: Path) -> None:
    doc = json.loads((data_dir / "split" / "latency_split-slo.json").read_text())
    names = [t["name"] for t in doc["data"]["targets"]]
    doc["data"]["prefix_cache"] = [
        {"url": "http://127.0.0.1:1/metrics", "source": "zgtool", "hit_tokens": 1300.0, "query_tokens": 2000.0,
         "targets": {names[0]: {"hit_tokens": 1184.0, "query_tokens": 1536.0},
                     names[1]: {"hit_tokens": 116.0, "query_tokens": 464.0}}}]
    rec = tmp_path / "latency_split-prefix.json"
    rec.write_text(json.dumps(doc))
    html = section(render_files([rec], title="prefix"), "throughput")
    assert "<th>prefix-cache hits</th>" in html
    assert "77.1% (1,184 of 1,536 tokens)" in html and "25.0% (116 of 464 tokens)" in html
    plain = section(render_files([data_dir / "split" / "latency_split-slo.json"], title="slo"), "throughput")
    assert "prefix-cache hits" not in plain       # not read: no column of dashes

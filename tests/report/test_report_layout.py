"""The report shows what its inputs hold and no more: a sweep-only report renders no empty sections (each
kind it lacks is one line at the end) and no "nothing to act on" above the sweep; the waterfall shows
every path's whole URL."""

from __future__ import annotations

import html as htmllib
import json
import re
from pathlib import Path

from sweep_data import synthetic_sweep_file

from zgtool.report.html import render_files

DATA = Path(__file__).parent / "data"


def _sections(page: str) -> list[str]:
    return re.findall(r'<section id="([^"]+)">', page)


def test_a_sweep_only_report_renders_no_empty_section(tmp_path: Path) -> None:
    page = render_files([synthetic_sweep_file(tmp_path)])
    # its one recommendation is the sweep's own headline, the 50% capacity tax (issue 33 item 6), never
    # "nothing to act on" above it
    assert _sections(page) == ["recommendations", "sweep", "environment", "absent"]
    assert "Nothing to act on" not in page and "saturates earlier than" in page
    absent = re.search(r'<section id="absent">(.*?)</section>', page, re.S)
    assert absent is not None
    lines = re.findall(r'<li id="absent-([^"]+)">', absent.group(1))
    assert "waterfall" in lines and "k6" in lines and "recommendations" not in lines
    assert page.count("Not in this report") == 2    # the nav link and the closing list's heading


def test_the_waterfall_shows_each_paths_whole_url(tmp_path: Path) -> None:
    src = json.loads((DATA / "split" / "latency_split-slo.json").read_text())
    long_urls = ["http://gateway-with-a-long-name.internal.example:18080/v1",
                 "https://engine-direct.internal.example:8443"]
    for t, url in zip(src["data"]["targets"], long_urls, strict=True):
        t["name"] = url
    f = tmp_path / "split.json"
    f.write_text(json.dumps(src))
    page = render_files([f])
    waterfall = re.search(r'<section id="waterfall">(.*?)</section>', page, re.S)
    assert waterfall is not None
    labels = [htmllib.unescape(x) for x in re.findall(r'<text class="rowlabel" x="0"[^>]*>([^<]*)</text>',
                                                      waterfall.group(1))]
    for url in long_urls:
        assert url in labels     # on its own line from x=0, never cut at a label column's edge


def test_every_load_point_of_a_sweep_is_labelled_on_the_x_axis(tmp_path: Path) -> None:
    page = render_files([synthetic_sweep_file(tmp_path)])
    sweep = re.search(r'<section id="sweep">(.*?)</section>', page, re.S)
    assert sweep is not None
    charts = re.findall(r'<svg class="chart".*?</svg>', sweep.group(1), re.S)
    assert charts
    for chart in charts:
        ticks = re.findall(r'<text class="tick"[^>]*text-anchor="middle">([^<]*)</text>', chart)
        assert [t for t in ticks if t in {"1", "2", "4", "8", "16"}] == ["1", "2", "4", "8", "16"], ticks

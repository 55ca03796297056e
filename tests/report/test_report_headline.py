"""The report's headline area (issue 25): cards lead with what is significant, with [lo, hi]; what
qualifies the measurement (client lag, a load generator behind, the machine's load) sits beside the
verdict; percentile intervals are never negative and say how they were drawn."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from report_build import diff, split, target

from zgtool.report.html import render_files


def html_of(tmp_path: Path, *results: dict[str, Any]) -> str:
    files = []
    for i, r in enumerate(results):
        f = tmp_path / f"latency_split-{i}.json"
        f.write_text(json.dumps(r))
        files.append(f)
    return render_files(files, title="t")


def section(html: str, sid: str) -> str:
    m = re.search(rf'<section id="{sid}">(.*?)</section>', html, re.S)
    assert m, sid
    return m.group(1)


def cards(html: str) -> list[str]:
    return re.findall(r'<div class="card[^"]*">(.*?</div>)</div>', section(html, "verdict"), re.S)


def test_cards_lead_with_the_outside_engine_tax_and_its_interval_totals_below_smaller(tmp_path: Path) -> None:
    r = split([diff("total_ms", 239.04, -80.0, 560.0), diff("outside_engine_ms", 21.1, 12.0, 30.0)],
              concurrency=8, direct_ms=900.0)
    (card,) = cards(html_of(tmp_path, r))
    big = re.search(r'<div class="v">([^<]+)</div><div class="ci">([^<]+)</div>', card)
    assert big and big.group(1) == "+21.10 ms" and big.group(2).startswith("[+12.0, +30.0] ms · significant")
    total = re.search(r'<div class="small">total <b>([^<]+)</b> <span class="ci">([^<]+)</span> · ([^<]+)</div>', card)
    assert total and total.groups() == ("+239.0 ms", "[-80.0, +560.0]", "not significant")
    assert card.index("outside the engine") < card.index("total <b>")


def test_a_streaming_card_shows_the_first_token_under_the_outside_engine_tax(tmp_path: Path) -> None:
    r = split([diff("total_ms", 30.1, -12.0, 71.0), diff("outside_engine_ms", 1.1, -3.0, 6.0),
               diff("ttft_ms", 35.9, 12.4, 58.0), diff("ttfb_ms", 80.8, 60.2, 101.0)], stream=True)
    html = html_of(tmp_path, r)
    (card,) = cards(html)
    assert "first token (TTFT) <b>+35.90 ms</b> <span class=\"ci\">[+12.4, +58.0]</span> · significant" in card
    headline = re.search(r'<p class="headline">([^<]+)</p>', html).group(1)
    assert headline.startswith("stack adds 35.9 ms to the first token")


def test_client_lag_and_the_machine_s_load_reach_the_headline_area(tmp_path: Path) -> None:
    samples = [{"ok": True, "lagged": i < 9, "client_lag_ms": 4.1 if i < 9 else 0.0} for i in range(30)]
    r = split([diff("total_ms", 1.0, -2.0, 4.0)], stream=True,
              environment={"host": "h", "zgtool": "0", "cpus": 2, "loadavg": [7.9, 6.2, 5.0]},
              targets=[target("direct", 100.0, samples=[{"ok": True} for _ in range(30)]),
                       target("stack", 100.0, samples=samples)])
    v = section(html_of(tmp_path, r), "verdict")
    box = re.search(r'<div class="warnbox" id="measurement-health">(.*?)</div>', v, re.S)
    assert box, "no measurement-health box"
    text = box.group(1)
    assert "15% of requests (9 of 60" in text and "stack at stream c=1: 9 of 30, up to 4.10 ms late" in text
    assert "machine load 7.9 / 6.2 / 5.0 (1/5/15 min) on 2 CPUs: busy" in text
    assert v.index("measurement-health") < v.index('class="cards"')


def test_a_load_generator_behind_its_schedule_reaches_the_headline_area(tmp_path: Path) -> None:
    ol = {"load_generator_behind": True, "achieved_rate_rps": 183.5, "target_rate_rps": 200.0,
          "dispatch_lag_p99_ms": 12.5, "reason": "sent 183.5 req/s against a schedule of 199.0 req/s: below 95%"}
    r = split([diff("total_ms", 1.0, -2.0, 4.0)],
              targets=[target("direct", 100.0), target("stack", 100.0, open_loop=ol)])
    v = section(html_of(tmp_path, r), "verdict")
    assert ("The load generator fell behind its schedule on stack at non-stream c=1: achieved 183.5 of 200 req/s; "
            "dispatch lag p99 12.50 ms; sent 183.5") in v


def test_a_quiet_run_has_no_warning_box(tmp_path: Path) -> None:
    r = split([diff("total_ms", 1.0, -2.0, 4.0)], environment={"host": "h", "cpus": 8, "loadavg": [0.5, 0.4, 0.3]})
    assert "measurement-health" not in html_of(tmp_path, r)


def test_percentile_intervals_are_never_negative_and_state_their_method(tmp_path: Path) -> None:
    r = split([diff("total_ms", 1.0, -2.0, 4.0)])
    ttft = {"count": 30, "summary": {"p50": 120.0, "p90": 900.0, "p95": 1500.0, "p99": 1893.0, "mean": 400.0},
            "median_lo": -114.0, "median_hi": 1893.0, "waterfall_mean_ms": None}
    r["data"]["targets"][0]["phases"]["ttft_ms"] = ttft
    r["data"]["targets"][1]["phases"]["ttft_ms"] = {**ttft, "median_lo": 80.0, "median_hi": 200.0, "ci_method": "log"}
    pct = section(html_of(tmp_path, r), "percentiles")
    assert "-114" not in pct and "−114" not in pct
    # issue 38: a latency's bound widened below 0 is no interval, never a clipped [0, ...]
    assert "<td class=num>no interval (widened below 0)</td><td></td>" in pct
    assert "<td class=num>[80, 200]</td><td>log latency</td>" in pct
    assert "drawn on log latency" in pct


def test_without_the_engine_s_time_the_waterfall_and_tax_say_unattributed_not_network(tmp_path: Path) -> None:
    r = split([diff("total_ms", 117.0, 90.0, 140.0), diff("network_client_ms", 679.0, 600.0, 750.0)],
              engine=(True, False), direct_ms=400.0)
    html = html_of(tmp_path, r)
    wf = section(html, "waterfall")
    assert "unattributed (engine time unknown)" in wf
    v = section(html, "verdict")
    assert "unattributed (engine time unknown)" in v
    recs = section(html, "recommendations")
    assert "network" not in recs.lower()


def test_the_percentile_table_names_which_first_byte_and_first_token_point_each_figure_is(tmp_path: Path) -> None:
    r = split([diff("total_ms", 1.0, -2.0, 4.0)], stream=True)
    point = {"count": 30, "summary": {"p50": 12.0, "p90": 14.0, "p95": 15.0, "p99": 16.0, "mean": 12.5},
             "median_lo": 11.0, "median_hi": 13.0, "waterfall_mean_ms": None, "ci_method": "log"}
    for t in r["data"]["targets"]:
        t["phases"].update({m: point for m in ("ttft_ms", "ttft_any_ms", "ttfb_headers_ms", "ttfb_body_ms")})
        t["num_lagged"] = 0
    r["data"]["definitions"] = {"ttft_any_ms": "request start -> the first generated token of any kind",
                                "ttfb_body_ms": "request's first byte out -> the first body byte arrived",
                                "ttft_ms": "request start -> first content token (ttft_ms, None if absent)"}
    pct = section(html_of(tmp_path, r), "percentiles")
    for name in ("TTFT, any token", "TTFB, first body byte", "TTFB, head complete", "TTFT"):
        assert f"<td>{name}</td>" in pct
    assert "<b>TTFT, any token</b>: request start -&gt; the first generated token of any kind" in pct
    assert "ttft_ms" not in pct.split("What each figure measures")[1] and "None" not in pct


def test_a_stream_whose_every_request_was_lag_flagged_says_why_it_has_no_first_token_figure(tmp_path: Path) -> None:
    r = split([diff("total_ms", 1.0, -2.0, 4.0)], stream=True,
              targets=[target("direct", 100.0, num_lagged=8), target("stack", 100.0, num_lagged=7)])
    (card,) = cards(html_of(tmp_path, r))
    assert "no first-token figure" in card and "direct 8 of 30; stack 7 of 30 flagged" in card


def test_a_card_significant_alone_but_not_after_the_family_adjustment_says_so(tmp_path: Path) -> None:
    adj = {"comparisons": 2}
    one = split([diff("total_ms", 1.0, -5.0, 7.0),
                 diff("outside_engine_ms", 3.9, 0.4, 6.2, significant_adj=False, lo_adj=-0.7, hi_adj=7.0, **adj)])
    two = split([diff("total_ms", 1.0, -5.0, 7.0),
                 diff("outside_engine_ms", 16.7, 9.2, 22.9, significant_adj=True, lo_adj=6.7, hi_adj=26.2, **adj)],
                concurrency=8)
    first, second = cards(html_of(tmp_path, one, two))
    assert "significant alone, not after the family adjustment" in first
    assert "· significant</div>" in second


def test_every_result_records_the_machine_s_load_when_written() -> None:
    from zgtool.results import make_result

    la = make_result("latency_split", {})["environment"]["loadavg"]
    assert len(la) == 3 and all(isinstance(x, float) and x >= 0 for x in la)

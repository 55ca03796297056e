"""A gateway's access log as a workload (`--dataset access-log:FORMAT:PATH`) and as a witness of the hop
(`latency-split --from-log`), issue 39 item 5. nginx lines are written by the real nginx (zgtool's own
config, zgtool.gateway.nginx) in front of the real null engine; Envoy's and LiteLLM's are their documented
formats (neither runs here)."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from zgtest import run_zgtool

from zgtool.errors import UsageError
from zgtool.workload.accesslog import read
from zgtool.workload.logreplay import workload


@pytest.fixture(scope="module")
def nginx_log(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str, Path, Path]]:
    """(engine URL, nginx URL, nginx's access log, the split result of 12 measured requests through nginx)."""
    from engine_live import child

    from zgtool.gateway.nginx import find_nginx
    from zgtool.gateway.supervisor import LocalStack, StackConfig

    try:
        find_nginx()
    except Exception as exc:  # noqa: BLE001 - the binary is missing on this machine
        pytest.skip(f"nginx not available: {exc}")
    tmp = tmp_path_factory.mktemp("accesslog")
    with child(tmp, keyed=False) as live, LocalStack(StackConfig(upstream=live.url, paths=("nginx",))) as st:
        log = st.run_dir / "nginx-access.log"
        out = tmp / "split.json"
        r = run_zgtool("latency-split", live.url, st.urls["nginx"], "-n", "12", "--warmup", "1", "--brief",
                       "--from-log", f"nginx:{log}", "-o", str(out))
        assert r.returncode == 0, r.stderr
        yield live.url, st.urls["nginx"], log, out


def test_every_post_nginx_wrote_parses_with_its_timings_and_trace_id(nginx_log: tuple[str, str, Path, Path]) -> None:
    _, _, log, _ = nginx_log
    parsed = read("nginx", log)
    posts = [line for line in log.read_text().splitlines() if '"POST ' in line]
    assert parsed.skipped == 0 and len(parsed.entries) == len(posts) >= 12
    ids = [e.request_id for e in parsed.entries if e.request_id]   # detection's probes send no traceparent
    assert len(ids) >= 13 and all(re.fullmatch(r"[0-9a-f]{32}", i) for i in ids)
    for e in parsed.entries:
        assert e.total_ms is not None and e.upstream_ms is not None
        assert e.total_ms >= e.upstream_ms - 1.0     # both in whole ms, rounded apart: 0.001 vs 0.002 happens
        assert e.request_bytes and e.request_bytes > 0 and e.status == 200


def test_from_log_joins_every_measured_request_through_nginx(nginx_log: tuple[str, str, Path, Path],
                                                            tmp_path: Path) -> None:
    _, front, _, out = nginx_log
    html = tmp_path / "r.html"
    assert run_zgtool("report", "html", str(out), "-o", str(html)).returncode == 0
    assert 'id="fromlog"' in html.read_text() and "gateway by its log, ms" in html.read_text()
    data = json.loads(out.read_text())["data"]
    fl = data["from_log"]
    assert fl["format"] == "nginx" and fl["skipped"] == 0
    assert fl["targets"][front]["matched"] == 12          # the measured requests; warm-up lines are unmatched
    assert fl["zgtool_hop_ms"][front]["phase"] in ("outside_engine_ms", "total_ms")
    row = fl["requests"][0]
    assert row["log_gateway_ms"] == pytest.approx(row["log_total_ms"] - row["log_upstream_ms"], abs=1e-6)


def test_the_log_replays_open_loop_at_its_arrivals_and_sizes(nginx_log: tuple[str, str, Path, Path],
                                                              tmp_path: Path) -> None:
    engine, _, log, _ = nginx_log
    snapshot = tmp_path / "nginx.log"
    snapshot.write_text(log.read_text())
    parsed = read("nginx", snapshot)
    wl = workload(parsed, max_tokens=8)
    assert wl.offsets_s is not None and wl.offsets_s[0] == 0.0 and list(wl.offsets_s) == sorted(wl.offsets_s)
    assert [s.input_tokens for s in wl.specs] == [max(1, (e.request_bytes - 250) // 4) for e in parsed.entries]
    out = tmp_path / "replay.json"
    r = run_zgtool("latency-split", engine, "--dataset", f"access-log:nginx:{snapshot}", "--warmup", "0",
                   "--brief", "-o", str(out))
    assert r.returncode in (0, 5), r.stderr            # 5: this machine fell behind the log's schedule (said)
    data = json.loads(out.read_text())["data"]
    assert data["config"]["workload"]["kind"] == "access-log"
    assert data["targets"][0]["num_ok"] == len(parsed.entries)


def test_malformed_lines_are_skipped_with_a_count_and_the_first_line_number(
        nginx_log: tuple[str, str, Path, Path], tmp_path: Path) -> None:
    _, _, log, _ = nginx_log
    real = [line for line in log.read_text().splitlines() if '"POST ' in line][:3]
    f = tmp_path / "mixed.log"
    f.write_text("\n".join([real[0], "garbage line", real[1], '1.2.3.4 - - [bad time] "POST / HTTP/1.1" 200 1 "-" "-" 0.1',
                            real[2]]) + "\n")
    parsed = read("nginx", f)
    assert len(parsed.entries) == 3 and parsed.skipped == 2 and parsed.first_bad_line == 2
    assert "2 malformed line(s) skipped (first: line 2" in " ".join(workload(parsed).notes)


def test_a_log_with_no_usable_line_exits_2_and_sends_nothing(tmp_path: Path) -> None:
    f = tmp_path / "bad.log"
    f.write_text("not a log line\nneither is this\n")
    r = run_zgtool("latency-split", "http://127.0.0.1:1", "--dataset", f"access-log:nginx:{f}")
    assert r.returncode == 2
    assert "no usable request" in r.stderr and "first: line 1" in r.stderr and "nothing was sent" in r.stderr


ENVOY_JSON = ('{"start_time":"2026-12-06T01:00:00.250Z","method":"POST","x-envoy-origin-path":"/v1/chat/completions",'
              '"protocol":"HTTP/1.1","response_code":200,"response_flags":"-","bytes_received":1250,"bytes_sent":900,'
              '"duration":120,"x-envoy-upstream-service-time":"95","x-forwarded-for":null,"user-agent":"curl",'
              '"x-request-id":"abc-1",":authority":"gw","upstream_host":"10.0.0.1:8000"}')
ENVOY_TEXT = ('[2026-12-06T01:00:00.750Z] "POST /v1/chat/completions HTTP/1.1" 200 - 850 700 80 61 "-" "curl" '
              '"abc-2" "gw" "10.0.0.1:8000"')


def test_envoys_default_json_and_text_lines_read_with_millisecond_arrivals(tmp_path: Path) -> None:
    f = tmp_path / "envoy.log"
    f.write_text(ENVOY_JSON + "\n" + ENVOY_TEXT + "\n{broken\n")
    log = read("envoy", f)
    a, b = log.entries
    assert (a.request_id, a.total_ms, a.upstream_ms, a.request_bytes) == ("abc-1", 120.0, 95.0, 1250)
    assert (b.request_id, b.total_ms, b.upstream_ms, b.request_bytes) == ("abc-2", 80.0, 61.0, 850)
    assert b.start_s - a.start_s == pytest.approx(0.5) and log.skipped == 1 and log.first_bad_line == 3


def test_litellm_spend_logs_give_token_counts_and_the_provider_call_time(tmp_path: Path) -> None:
    rows = [{"request_id": "chatcmpl-1", "call_type": "acompletion", "startTime": "2026-12-06T01:00:00.000000",
             "endTime": "2026-12-06T01:00:00.420000", "prompt_tokens": 57, "completion_tokens": 12, "status": "success"},
            {"request_id": "chatcmpl-2", "call_type": "acompletion", "startTime": "2026-12-06T01:00:02.000000",
             "endTime": "2026-12-06T01:00:02.100000", "prompt_tokens": 9, "completion_tokens": 3, "status": "success"}]
    f = tmp_path / "spend.json"
    f.write_text(json.dumps(rows))
    wl = workload(read("litellm", f), max_tokens=99)
    assert wl.offsets_s == (0.0, 2.0)
    assert [(s.input_tokens, s.max_tokens) for s in wl.specs] == [(57, 12), (9, 3)]
    assert read("litellm", f).entries[0].upstream_ms == pytest.approx(420.0)


def test_an_unknown_format_is_a_usage_error(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="choose nginx, envoy, litellm"):
        read("apache", tmp_path / "x.log")
    r = run_zgtool("latency-split", "http://127.0.0.1:1", "--from-log", "apache:x.log")
    assert r.returncode == 2 and "--from-log apache:x.log" in r.stderr

"""`zgtool dcgm watch` end to end: the real CLI against real loopback servers."""

from __future__ import annotations

import json

from dcgm_helpers import data, run_cli

from zgtool.dcgm.sources import EngineSource, ExporterSource
from zgtool.errors import ExitCode, TargetUnreachable, UsageError


def test_once_json_reads_every_gpu_of_a_recorded_exporter(exporter):
    exporter.body = data("exporter_3x_a800_8gpu_mig.txt")
    proc = run_cli("dcgm", "watch", "--endpoint", exporter.url, "--once", "--json")
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert result["schema"] == "zgtool.result/1" and result["kind"] == "dcgm.watch"
    d = result["data"]
    assert d["source"] == {"kind": "exporter", "url": exporter.url + "/metrics"}
    assert d["samples"] == 1 and d["stopped_by"] == "once"
    keys = [g["key"] for g in d["gpus"]]
    assert len(keys) == 10 and keys[3] == "msxf-hpc-64-35-ai/gpu1"
    g2 = next(g for g in d["gpus"] if g["key"] == "msxf-hpc-64-35-ai/gpu2")
    assert g2["last"]["power_w"] == 53.752
    assert g2["last"]["fb_used_bytes"] == 2 * 1024 * 1024
    assert g2["summary"]["power_w"]["p50"] == 53.752
    assert d["units"]["power_w"].endswith("W")


def test_once_table_shows_golden_metrics_per_gpu(exporter):
    exporter.body = data("exporter_49_h100_2gpu.txt")
    proc = run_cli("dcgm", "watch", "--endpoint", exporter.url, "--once")
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    for text in ("h100-node-07/gpu0", "h100-node-07/gpu1", "97.0", "91.0", "1980", "612.4",
                 "71.0/79.6 GiB"):
        assert text in out, (text, out)
    # one sample is shorter than the 30 s `for`: pending, not firing
    assert "(memory-bandwidth pending)" in out
    assert "ALERT" not in out


def test_record_writes_a_timeline_result_over_the_duration(exporter, tmp_path):
    exporter.body = data("exporter_49_h100_2gpu.txt")
    rules = tmp_path / "rules.toml"
    rules.write_text('[[rule]]\nname = "bw"\nexpr = "mem_copy_util_pct"\nthreshold = 80\nfor = "0.4s"\n'
                     'message = "bandwidth-bound"\n')
    out = tmp_path / "watch.json"
    proc = run_cli("dcgm", "watch", "--endpoint", exporter.url, "--interval", "0.2", "--duration", "0.8",
                   "--rules", str(rules), "--record", str(out), "--json", "--fail-on-alert")
    assert proc.returncode == ExitCode.VERDICT_FAILED, proc.stderr
    assert "alerts fired: bw" in proc.stderr
    result = json.loads(out.read_text())
    d = result["data"]
    assert d["stopped_by"] == "duration" and d["samples"] == 5
    g0 = d["gpus"][0]
    assert len(g0["t_s"]) == 5 and g0["t_s"] == sorted(g0["t_s"])
    assert g0["series"]["mem_copy_util_pct"] == [91.0] * 5
    (alert,) = d["alerts"]
    assert alert["gpu"] == "h100-node-07/gpu0" and alert["state"] == "firing"
    assert alert["fired_at_s"] >= 0.4 and alert["pending_since_s"] < alert["fired_at_s"]


def test_nvml_without_a_driver_exits_4_with_the_message_and_no_traceback():
    proc = run_cli("dcgm", "watch", "--nvml", "--once")
    assert proc.returncode == ExitCode.MISSING_CAPABILITY
    assert "NVML unavailable" in proc.stderr and "--endpoint URL" in proc.stderr
    assert "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


def test_no_source_and_no_driver_exits_4_listing_the_options():
    proc = run_cli("dcgm", "watch", "--once")
    assert proc.returncode == ExitCode.MISSING_CAPABILITY
    for opt in ("--endpoint", "--prometheus", "--engine", "--nvml"):
        assert opt in proc.stderr
    assert "Traceback" not in proc.stderr


def test_unreachable_exporter_exits_3(free_port):
    proc = run_cli("dcgm", "watch", "--endpoint", f"http://127.0.0.1:{free_port}", "--once")
    assert proc.returncode == ExitCode.UNREACHABLE
    assert "cannot reach dcgm-exporter" in proc.stderr and "Traceback" not in proc.stderr


def test_two_sources_or_bad_rules_exit_2(exporter, tmp_path):
    proc = run_cli("dcgm", "watch", "--endpoint", exporter.url, "--nvml", "--once")
    assert proc.returncode == ExitCode.USAGE and "choose one source" in proc.stderr
    bad = tmp_path / "r.toml"
    bad.write_text("[[rule]\n")
    proc = run_cli("dcgm", "watch", "--endpoint", exporter.url, "--once", "--rules", str(bad))
    assert proc.returncode == ExitCode.USAGE and "invalid TOML" in proc.stderr


def test_help_states_units_and_rule_semantics():
    proc = run_cli("dcgm", "watch", "--help")
    assert proc.returncode == 0
    text = " ".join(proc.stdout.split())
    for phrase in ("fb_used_bytes", "MHz", "ratios are x100", "power_w is W", "for", "bandwidth-bound"):
        assert phrase in text, phrase


def test_exporter_source_maps_http_and_content_errors(exporter):
    src = ExporterSource(exporter.url + "/other")
    try:
        src.read()
        raise AssertionError("expected an error")
    except TargetUnreachable as exc:
        assert "HTTP 404" in exc.message
    finally:
        src.close()
    exporter.body = "# TYPE up gauge\nup 1\n"
    src = ExporterSource(exporter.url)
    try:
        src.read()
        raise AssertionError("expected an error")
    except UsageError as exc:
        assert "no DCGM GPU metrics" in exc.message
    finally:
        src.close()


def test_a_failed_read_mid_watch_is_recorded_as_a_gap_not_the_end(exporter):
    from zgtool.dcgm.watch import WatchConfig, watch

    exporter.body = data("exporter_classic_t4.txt")
    calls = iter([200, 500, 200])

    def tick(_state):
        exporter.status = next(calls, 200)

    src = ExporterSource(exporter.url)
    state = watch(src, [], WatchConfig(interval_s=0.05, duration_s=0.15), on_tick=tick)
    src.close()
    assert len(state.errors) == 1 and "HTTP 500" in state.errors[0]["error"]
    assert state.ticks == 3


def test_engine_source_reads_kv_and_queue_figures(exporter):
    exporter.body = (
        "# TYPE zg_num_requests_running gauge\nzg_num_requests_running 4\n"
        "# TYPE zg_num_requests_waiting gauge\nzg_num_requests_waiting 1\n"
        "# TYPE zg_kv_cache_usage_perc gauge\nzg_kv_cache_usage_perc 0.5\n"
        "# TYPE zg_batch_size gauge\nzg_batch_size 4\n"
    )
    src = EngineSource(exporter.url)
    (row,) = src.read()
    src.close()
    assert row.metrics == {"running": 4.0, "waiting": 1.0, "kv_util_pct": 50.0, "batch_size": 4.0}
    proc = run_cli("dcgm", "watch", "--engine", exporter.url, "--once")
    assert proc.returncode == 0, proc.stderr
    assert "4/1/4" in proc.stdout and "50.0" in proc.stdout

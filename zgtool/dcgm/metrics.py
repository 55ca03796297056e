"""Metric names of every source mapped to one internal unit set, and exposition parsing.

dcgm-exporter changed its names and units in 4.9 (MHz -> Hz, % -> ratio, MiB -> bytes);
both generations (and the 1.x lower-case names) map here, so nothing downstream
depends on which exporter a user runs.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TypedDict

from zgtool.errors import UsageError

MIB = 1024 * 1024

# Internal unit set: the unit is in the name; this table is what --help and results show.
UNITS: dict[str, str] = {
    "gpu_util_pct": "% of time a kernel ran (0-100)",
    "mem_copy_util_pct": "% of time device memory was read/written (0-100)",
    "fb_used_bytes": "bytes of framebuffer in use",
    "fb_free_bytes": "bytes of framebuffer free",
    "fb_total_bytes": "bytes of framebuffer (capacity, or used+free+reserved)",
    "fb_used_pct": "fb_used_bytes / fb_total_bytes * 100",
    "sm_clock_mhz": "SM clock in MHz",
    "power_w": "board power draw in W",
    "dram_active_pct": "DCGM profiling DRAM_ACTIVE as % (0-100)",
    "kv_util_pct": "engine KV-cache blocks in use, % of the pool",
    "running": "engine requests running",
    "waiting": "engine requests waiting",
    "batch_size": "engine sequences in the last step's batch",
}

GOLDEN = ("gpu_util_pct", "mem_copy_util_pct", "fb_used_bytes", "sm_clock_mhz", "power_w")

# raw sample name -> (internal name, factor to the internal unit)
_DCGM_NAMES: dict[str, tuple[str, float]] = {
    # classic dcgm-exporter (2.x-4.8): %, MiB, MHz, W
    "DCGM_FI_DEV_GPU_UTIL": ("gpu_util_pct", 1.0),
    "DCGM_FI_DEV_MEM_COPY_UTIL": ("mem_copy_util_pct", 1.0),
    "DCGM_FI_DEV_FB_USED": ("fb_used_bytes", MIB),
    "DCGM_FI_DEV_FB_FREE": ("fb_free_bytes", MIB),
    "DCGM_FI_DEV_FB_TOTAL": ("fb_total_bytes", MIB),
    "DCGM_FI_DEV_FB_RESERVED": ("fb_reserved_bytes", MIB),
    "DCGM_FI_DEV_SM_CLOCK": ("sm_clock_mhz", 1.0),
    "DCGM_FI_DEV_POWER_USAGE": ("power_w", 1.0),
    "DCGM_FI_PROF_DRAM_ACTIVE": ("dram_active_pct", 100.0),
    # 1.x compatibility names (etc/1.x-compatibility-metrics.csv)
    "dcgm_gpu_utilization": ("gpu_util_pct", 1.0),
    "dcgm_mem_copy_utilization": ("mem_copy_util_pct", 1.0),
    "dcgm_fb_used": ("fb_used_bytes", MIB),
    "dcgm_fb_free": ("fb_free_bytes", MIB),
    "dcgm_sm_clock": ("sm_clock_mhz", 1.0),
    "dcgm_power_usage": ("power_w", 1.0),
    "dcgm_fi_prof_dram_active": ("dram_active_pct", 100.0),
    # 4.9+ base-unit names: ratios, bytes, Hz
    "DCGM_FI_DEV_GPU_UTIL_RATIO": ("gpu_util_pct", 100.0),
    "DCGM_FI_DEV_MEMORY_UTIL_RATIO": ("mem_copy_util_pct", 100.0),
    "DCGM_FI_DEV_MEM_COPY_UTIL_RATIO": ("mem_copy_util_pct", 100.0),
    "DCGM_FI_DEV_FB_USED_BYTES": ("fb_used_bytes", 1.0),
    "DCGM_FI_DEV_FB_FREE_BYTES": ("fb_free_bytes", 1.0),
    "DCGM_FI_DEV_FB_CAPACITY_BYTES": ("fb_total_bytes", 1.0),
    "DCGM_FI_DEV_FB_RESERVED_BYTES": ("fb_reserved_bytes", 1.0),
    "DCGM_FI_DEV_SM_CLOCK_HERTZ": ("sm_clock_mhz", 1e-6),
    "DCGM_FI_DEV_BOARD_POWER_WATTS": ("power_w", 1.0),
}

# The zgtool engine exports zg_* (vLLM-like); vLLM's own names work too.
_ENGINE_NAMES: dict[str, tuple[str, float]] = {
    "zg_num_requests_running": ("running", 1.0),
    "zg_num_requests_waiting": ("waiting", 1.0),
    "zg_kv_cache_usage_perc": ("kv_util_pct", 100.0),
    "zg_batch_size": ("batch_size", 1.0),
    "zg_gpu_sm_util_perc": ("gpu_util_pct", 1.0),
    # engine/server/metrics.py today: sm_util as torch reports it (0-100), free VRAM in GB
    "zg_gpu_sm_util": ("gpu_util_pct", 1.0),
    "zg_gpu_vram_free_gb": ("fb_free_bytes", 1e9),
    "zg_gpu_vram_free_bytes": ("fb_free_bytes", 1.0),
    "zg_gpu_vram_used_bytes": ("fb_used_bytes", 1.0),
    "zg_gpu_vram_total_bytes": ("fb_total_bytes", 1.0),
    "vllm:num_requests_running": ("running", 1.0),
    "vllm:num_requests_waiting": ("waiting", 1.0),
    "vllm:kv_cache_usage_perc": ("kv_util_pct", 100.0),
    "vllm:gpu_cache_usage_perc": ("kv_util_pct", 100.0),
    # the other engines' documented names (as zgtool.latency.attribution.series reads them)
    "sglang:num_running_reqs": ("running", 1.0),
    "sglang:num_queue_reqs": ("waiting", 1.0),
    "sglang:token_usage": ("kv_util_pct", 100.0),
    "tgi_batch_current_size": ("running", 1.0),
    "tgi_queue_size": ("waiting", 1.0),
    "llamacpp:requests_processing": ("running", 1.0),
    "llamacpp:requests_deferred": ("waiting", 1.0),
    "llamacpp:kv_cache_usage_ratio": ("kv_util_pct", 100.0),
}
# which engine exports a metric, by its name's prefix (the device column names it)
_ENGINE_BY_PREFIX = (("zg_", "zgtool engine"), ("vllm:", "vLLM"), ("sglang:", "SGLang"), ("tgi_", "TGI"),
                     ("llamacpp:", "llama.cpp"))

DCGM_SAMPLE_NAMES: tuple[str, ...] = tuple(_DCGM_NAMES)
ENGINE_SAMPLE_NAMES: tuple[str, ...] = tuple(_ENGINE_NAMES)
KNOWN_METRICS: frozenset[str] = frozenset(UNITS) | {"fb_reserved_bytes"}


@dataclass
class GpuReading:
    """One GPU (or MIG instance, or engine) at one instant, in internal units."""

    key: str
    host: str = ""
    gpu: str = ""
    uuid: str = ""
    model: str = ""
    mig: str = ""
    metrics: dict[str, float] = field(default_factory=dict)


def derive(metrics: dict[str, float]) -> dict[str, float]:
    """Fill fb_total/fb_used_pct: the classic exporter has no total, only used+free(+reserved)."""
    m = dict(metrics)
    if "fb_total_bytes" not in m and "fb_used_bytes" in m and "fb_free_bytes" in m:
        m["fb_total_bytes"] = m["fb_used_bytes"] + m["fb_free_bytes"] + m.get("fb_reserved_bytes", 0.0)
    if "fb_free_bytes" not in m and "fb_total_bytes" in m and "fb_used_bytes" in m:
        m["fb_free_bytes"] = m["fb_total_bytes"] - m["fb_used_bytes"] - m.get("fb_reserved_bytes", 0.0)
    if "fb_used_bytes" not in m and "fb_total_bytes" in m and "fb_free_bytes" in m:
        m["fb_used_bytes"] = m["fb_total_bytes"] - m["fb_free_bytes"] - m.get("fb_reserved_bytes", 0.0)
    if m.get("fb_total_bytes") and "fb_used_bytes" in m:
        m["fb_used_pct"] = 100.0 * m["fb_used_bytes"] / m["fb_total_bytes"]
    return m


class _Identity(TypedDict):
    """GpuReading's identity fields, as read from the exporter's labels."""

    host: str
    gpu: str
    uuid: str
    model: str
    mig: str


def _gpu_identity(labels: Mapping[str, str]) -> tuple[str, _Identity] | None:
    gpu = labels.get("gpu")
    if gpu is None:
        return None  # host-level or unlabeled series: not a GPU row
    # Prometheus adds `instance`; exporters before ~4.x say Hostname, newer ones hostname.
    host = labels.get("Hostname") or labels.get("hostname") or labels.get("instance") or ""
    mig = labels.get("GPU_I_ID", "")
    key = f"{host}/gpu{gpu}" + (f"/mig{mig}" if mig else "")
    ident: _Identity = {
        "host": host,
        "gpu": gpu,
        "uuid": labels.get("UUID") or labels.get("uuid", ""),
        "model": labels.get("modelName", ""),
        "mig": f"{labels.get('GPU_I_PROFILE', '')}#{mig}" if mig else "",
    }
    return key, ident


def normalise_dcgm(samples: Iterable[tuple[str, Mapping[str, str], float]]) -> list[GpuReading]:
    """(raw name, labels, value) triples -> one GpuReading per GPU/MIG instance, sorted."""
    rows: dict[str, GpuReading] = {}
    for name, labels, value in samples:
        spec = _DCGM_NAMES.get(name)
        if spec is None or value is None or math.isnan(value):
            continue
        ident = _gpu_identity(labels)
        if ident is None:
            continue
        key, info = ident
        row = rows.get(key)
        if row is None:
            row = rows[key] = GpuReading(key=key, **info)
        internal, factor = spec
        row.metrics[internal] = value * factor
    out = [GpuReading(r.key, r.host, r.gpu, r.uuid, r.model, r.mig, derive(r.metrics)) for r in rows.values()]
    return sorted(out, key=_sort_key)


def normalise_engine(samples: Iterable[tuple[str, Mapping[str, str], float]], key: str) -> GpuReading:
    """The engine's row, named after the engine whose metric names it exports (vLLM's vllm:*, zgtool's zg_*)."""
    metrics: dict[str, float] = {}
    engines: list[str] = []
    for name, _labels, value in samples:
        spec = _ENGINE_NAMES.get(name)
        if spec is not None and not math.isnan(value):
            internal, factor = spec
            metrics[internal] = metrics.get(internal, 0.0) + value * factor  # sum across label sets
            engine = next((e for prefix, e in _ENGINE_BY_PREFIX if name.startswith(prefix)), None)
            if engine is not None and engine not in engines:
                engines.append(engine)
    return GpuReading(key=key, host=key, model=" + ".join(engines) or "engine", metrics=derive(metrics))


def _sort_key(r: GpuReading) -> tuple[str, int, str, str]:
    try:
        idx = int(r.gpu)
    except ValueError:
        idx = 1 << 30
    return (r.host, idx, r.gpu, r.mig)


def parse_exposition(text: str) -> list[tuple[str, dict[str, str], float]]:
    """Prometheus text -> (sample name, labels, value) with prometheus_client's parser.

    Real exporters emit lines the parser rejects (dcgm-exporter 3.x writes
    `... ERROR - FAILED TO CONVERT TO STRING` for vGPU fields), so on a parse error the
    offending sample lines are dropped and the rest parsed, instead of losing the scrape.
    """
    from prometheus_client.parser import text_string_to_metric_families

    try:
        return _collect(text_string_to_metric_families(text))
    except ValueError:
        pass
    kept = [ln for ln in text.splitlines() if ln.startswith("#") or not ln.strip() or _line_ok(ln)]
    try:
        return _collect(text_string_to_metric_families("\n".join(kept) + "\n"))
    except ValueError as exc:
        raise UsageError(f"not a Prometheus text exposition: {exc}") from exc


def _collect(families: Iterable) -> list[tuple[str, dict[str, str], float]]:
    return [(s.name, dict(s.labels), float(s.value)) for fam in families for s in fam.samples]


def _line_ok(line: str) -> bool:
    """True when the sample line's value token is a number (labels may hold any text)."""
    rest = line.rsplit("}", 1)[1] if "}" in line else line.split(None, 1)[1] if " " in line else ""
    parts = rest.split()
    if not parts:
        return False
    try:
        float(parts[0])
        return True
    except ValueError:
        return False

"""The "engine.metrics" snapshot: the engine's /metrics (parsed with prometheus_client) and /admin/kv.

Data (kind "engine.metrics"):
    url, families {name: {type, help, samples [{name, labels, value}]}},
    histograms {name: {count, sum, mean_ms, buckets [[le_ms, cumulative_count]]}}   (seconds -> ms)
    values {sample name: value}  every unlabelled-or-single-series gauge/counter sample
    derived {prefix_cache_hit_rate, kv_util, preemptions, requests_ok, generation_tokens, engine_steps, mean_batch}
    kv {...} | None and kv_error when /admin/kv could not be read (e.g. admin key required)
"""

from __future__ import annotations

import math
from typing import Any

from zgtool.errors import TargetUnreachable


def _histograms(families: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, fam in families.items():
        if fam["type"] != "histogram":
            continue
        # one series per model: sum buckets over label sets other than `le`
        buckets: dict[float, float] = {}
        count = total = 0.0
        for s in fam["samples"]:
            if s["name"].endswith("_bucket"):
                le = float(s["labels"].get("le", "inf"))
                buckets[le] = buckets.get(le, 0.0) + s["value"]
            elif s["name"].endswith("_count"):
                count += s["value"]
            elif s["name"].endswith("_sum"):
                total += s["value"]
        scale = 1000.0 if name.endswith("_seconds") else 1.0
        out[name] = {
            "count": count, "sum": total,
            "mean_ms": total / count * scale if count else None,
            "buckets": [[le * scale if math.isfinite(le) else None, c] for le, c in sorted(buckets.items())],
        }
    return out


def parse_metrics(text: str) -> dict[str, Any]:
    from prometheus_client.parser import text_string_to_metric_families

    families: dict[str, Any] = {}
    for fam in text_string_to_metric_families(text):
        families[fam.name] = {
            "type": fam.type, "help": fam.documentation,
            "samples": [{"name": s.name, "labels": dict(s.labels), "value": s.value} for s in fam.samples],
        }
    values: dict[str, float] = {}
    for fam in families.values():
        if fam["type"] in ("gauge", "counter"):
            for s in fam["samples"]:
                if s["name"].endswith("_created"):
                    continue
                values[s["name"]] = values.get(s["name"], 0.0) + s["value"]
    return {"families": families, "histograms": _histograms(families), "values": values}


def derive(values: dict[str, float]) -> dict[str, Any]:
    queries = values.get("zg_prefix_cache_queries_total", values.get("zg_prefix_cache_queries"))
    hits = values.get("zg_prefix_cache_hits_total", values.get("zg_prefix_cache_hits"))
    steps = values.get("zg_engine_steps_total")
    seqs = values.get("zg_engine_step_sequences_total")
    return {
        "prefix_cache_queries": queries,
        "prefix_cache_hits": hits,
        "prefix_cache_hit_rate": hits / queries if queries and hits is not None else None,
        "kv_util": values.get("zg_kv_cache_usage_perc"),
        "preemptions": values.get("zg_num_preemptions_total", values.get("zg_num_preemptions")),
        "requests_ok": values.get("zg_request_success_total"),
        "generation_tokens": values.get("zg_generation_tokens_total"),
        "engine_steps": steps,
        "mean_batch": seqs / steps if steps and seqs is not None else None,    # sequences per step, since start
        "prompt_tokens": values.get("zg_prompt_tokens_total"),
        "gpu_sm_util": values.get("zg_gpu_sm_util"),
        "gpu_vram_free_gb": values.get("zg_gpu_vram_free_gb"),
    }


def snapshot(engine_url: str, *, admin_key: str | None = None, timeout_s: float = 10.0) -> dict[str, Any]:
    import httpx

    base = engine_url.rstrip("/")
    headers = {"x-api-key": admin_key} if admin_key else {}
    try:
        with httpx.Client(timeout=timeout_s, verify=False) as client:
            resp = client.get(base + "/metrics")
            kv_resp = client.get(base + "/admin/kv", headers=headers)
    except httpx.HTTPError as exc:
        raise TargetUnreachable(f"engine {base} did not answer /metrics: {exc}") from exc
    if resp.status_code != 200:
        raise TargetUnreachable(f"engine {base}/metrics answered HTTP {resp.status_code}")
    data: dict[str, Any] = {"url": base, **parse_metrics(resp.text)}
    data["derived"] = derive(data["values"])
    if kv_resp.status_code == 200:
        data["kv"], data["kv_error"] = kv_resp.json(), None
    else:
        data["kv"], data["kv_error"] = None, f"/admin/kv answered HTTP {kv_resp.status_code}"
    return data

"""The dashboard as data: panels of PromQL over what the engine's /metrics (zg_*, vLLM-like names),
pygw's /metrics (pygw_*: the gateway hop) and dcgm-exporter (DCGM_FI_*, classic names) expose. `zgtool grafana export` writes it as Grafana's
JSON model (schemaVersion 39), importable as is; tests/grafana checks every query against a live
engine and pygw scraped by a real Prometheus and against recorded dcgm-exporter pages.

Histograms are read as quantiles of their rate (`histogram_quantile(q, sum by (le) (rate(..._bucket
[$__rate_interval])))`), the way vLLM's own dashboard does.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

UID = "zgtool-engine"
DS = {"type": "prometheus", "uid": "${datasource}"}


@dataclass(frozen=True)
class Panel:
    title: str
    unit: str
    exprs: tuple[tuple[str, str], ...]   # (legend, PromQL)
    source: str = "engine"               # engine | pygw | dcgm (which exporter the query reads)
    description: str = ""


def _q(metric: str, q: float, labels: str = '{model_name=~"$model"}') -> str:
    return f"histogram_quantile({q}, sum by (le) (rate({metric}_bucket{labels}[$__rate_interval])))"


def _gw(metric: str, q: float) -> str:
    return _q(metric, q, "")   # pygw's series carry no model label


M = '{model_name=~"$model"}'
PANELS: tuple[Panel, ...] = (
    Panel("Requests running / waiting / held", "short", (
        ("running", f"sum(zg_num_requests_running{M})"), ("waiting", f"sum(zg_num_requests_waiting{M})"),
        ("held (client far behind)", f"sum(zg_num_requests_held{M})"))),
    Panel("KV cache usage", "percentunit", (("used", f"max(zg_kv_cache_usage_perc{M})"),)),
    Panel("Time to first token (arrival to first token)", "s",
          (("p50", _q("zg_time_to_first_token_seconds", 0.5)), ("p99", _q("zg_time_to_first_token_seconds", 0.99)))),
    Panel("Inter-token latency", "s", (("p50", _q("zg_inter_token_latency_seconds", 0.5)),
                                       ("p99", _q("zg_inter_token_latency_seconds", 0.99)))),
    Panel("End-to-end request latency", "s", (("p50", _q("zg_e2e_request_latency_seconds", 0.5)),
                                              ("p99", _q("zg_e2e_request_latency_seconds", 0.99)))),
    Panel("Queue time (arrival to first scheduled)", "s", (("p99", _q("zg_request_queue_time_seconds", 0.99)),)),
    Panel("Tokens per second", "short", (
        ("generated", f"sum(rate(zg_generation_tokens_total{M}[$__rate_interval]))"),
        ("prompt", f"sum(rate(zg_prompt_tokens_total{M}[$__rate_interval]))"))),
    Panel("Prefix-cache hit rate (prompt tokens)", "percentunit", (
        ("hits / queries", f"sum(rate(zg_prefix_cache_hits_total{M}[$__rate_interval])) / "
                           f"sum(rate(zg_prefix_cache_queries_total{M}[$__rate_interval]))"),)),
    Panel("Finished requests by reason", "reqps", (
        ("{{finished_reason}}", f"sum by (finished_reason) (rate(zg_request_success_total{M}[$__rate_interval]))"),)),
    Panel("Error answers by type", "reqps", (
        ("{{error_type}}", f"sum by (error_type) (rate(zg_request_errors_total{M}[$__rate_interval]))"),)),
    Panel("Engine stalled (work, no step)", "s", (("stalled", f"max(zg_engine_stalled_seconds{M})"),),
          description="Seconds the engine has had work but run no step; /health says degraded past 30 s."),
    Panel("Preemptions", "short", (("preempted", f"sum(rate(zg_num_preemptions_total{M}[$__rate_interval]))"),)),
    Panel("Engine mean batch (sequences per step)", "short", (
        ("sequences / step", f"sum(rate(zg_engine_step_sequences_total{M}[$__rate_interval])) / "
                             f"sum(rate(zg_engine_steps_total{M}[$__rate_interval]))"),),
          description="How many requests each engine step computed, on average: low under load means the steps "
                      "run on partial batches (clients busy elsewhere, admission, a short queue)."),
    Panel("pygw answers by route and status", "reqps", (
        ("{{route}} {{status}}", "sum by (route, status) (rate(pygw_requests_total[$__rate_interval]))"),), "pygw",
          description="Answers pygw sent; status 0: the client left before the answer."),
    Panel("pygw upstream latency (request sent to response headers)", "s", (
        ("p50", _gw("pygw_upstream_latency_seconds", 0.5)), ("p99", _gw("pygw_upstream_latency_seconds", 0.99))),
          "pygw", description="The engine as pygw sees it: for a stream, to its headers, not its last token."),
    Panel("pygw own overhead (auth, limits, cache, translate, moderation)", "s", (
        ("p50", _gw("pygw_overhead_seconds", 0.5)), ("p99", _gw("pygw_overhead_seconds", 0.99))), "pygw",
          description="What the gateway hop adds before the answer starts, beside the upstream call."),
    Panel("pygw upstream retries", "short", (
        ("retries", "sum(rate(pygw_upstream_retries_total[$__rate_interval]))"),), "pygw"),
    Panel("GPU utilisation", "percent", (("{{gpu}}", "avg by (gpu) (DCGM_FI_DEV_GPU_UTIL)"),), "dcgm"),
    Panel("GPU memory bandwidth busy (DRAM active)", "percentunit",
          (("{{gpu}}", "avg by (gpu) (DCGM_FI_PROF_DRAM_ACTIVE)"),), "dcgm"),
    Panel("GPU framebuffer used", "decmbytes", (("{{gpu}}", "sum by (gpu) (DCGM_FI_DEV_FB_USED)"),), "dcgm"),
    Panel("GPU SM clock", "rotmhz", (("{{gpu}}", "avg by (gpu) (DCGM_FI_DEV_SM_CLOCK)"),), "dcgm"),
    Panel("GPU power", "watt", (("{{gpu}}", "sum by (gpu) (DCGM_FI_DEV_POWER_USAGE)"),), "dcgm"),
)


def queries() -> list[tuple[str, str]]:
    """(source, PromQL) of every query of every panel."""
    return [(p.source, expr) for p in PANELS for _, expr in p.exprs]


def dashboard(title: str = "zgtool engine") -> dict[str, Any]:
    panels = []
    for i, p in enumerate(PANELS):
        panels.append({
            "id": i + 1, "type": "timeseries", "title": p.title, "description": p.description, "datasource": DS,
            "gridPos": {"h": 8, "w": 12, "x": 12 * (i % 2), "y": 8 * (i // 2)},
            "fieldConfig": {"defaults": {"unit": p.unit}, "overrides": []},
            "targets": [{"refId": chr(65 + j), "datasource": DS, "expr": expr, "legendFormat": legend}
                        for j, (legend, expr) in enumerate(p.exprs)],
        })
    return {
        "uid": UID, "title": title, "tags": ["zgtool", "llm", "inference"], "timezone": "browser",
        "schemaVersion": 39, "version": 1, "refresh": "10s", "time": {"from": "now-30m", "to": "now"},
        "templating": {"list": [
            {"name": "datasource", "type": "datasource", "query": "prometheus", "label": "Prometheus"},
            {"name": "model", "type": "query", "datasource": DS, "label": "model", "includeAll": True,
             "multi": True, "allValue": ".*", "refresh": 2,
             "query": {"query": "label_values(zg_num_requests_running, model_name)", "refId": "models"}},
        ]},
        "panels": panels,
    }


def render(title: str = "zgtool engine") -> str:
    return json.dumps(dashboard(title), indent=2) + "\n"

"""Prometheus metrics (``zg_`` prefix, vLLM-like names) on a per-server registry.

Histograms are observed once per finished request on the I/O loop (the inter-token
gaps come from the request's token timestamps), so the per-token path does no metric
work. Engine gauges (running, waiting, KV use, prefix cache) are read from
``engine.stats()`` at scrape time.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

CONTENT_TYPE = b"text/plain; version=0.0.4; charset=utf-8"

# Same spirit as vLLM's buckets: fine at the low end, where a fused path lives.
TTFT_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5,
                0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0)
ITL_BUCKETS = (0.0001, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2,
               0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0)
E2E_BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0,
               15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0)


class _EngineCollector(Collector):
    def __init__(self, stats: Callable[[], dict[str, Any]], model: str, extra: Callable[[], dict[str, float]]):
        self._stats = stats
        self._model = model
        self._extra = extra

    def collect(self) -> Iterator[Metric]:
        s = self._stats()
        m = [self._model]

        def gauge(name: str, doc: str, value: Any) -> GaugeMetricFamily:
            g = GaugeMetricFamily(name, doc, labels=["model_name"])
            g.add_metric(m, float(value or 0))
            return g

        def counter(name: str, doc: str, value: Any) -> CounterMetricFamily:
            c = CounterMetricFamily(name, doc, labels=["model_name"])
            c.add_metric(m, float(value or 0))
            return c

        yield gauge("zg_num_requests_running", "Requests in the running batch.", s.get("running"))
        yield gauge("zg_num_requests_waiting", "Requests waiting to be scheduled.", s.get("waiting"))
        yield gauge("zg_kv_cache_usage_perc", "KV pool use, 0..1.", s.get("kv_util"))
        yield gauge("zg_kv_blocks_used", "KV blocks in use.", s.get("kv_blocks_used"))
        yield gauge("zg_kv_blocks_total", "KV blocks in the pool.", s.get("kv_blocks_total"))
        yield counter("zg_prefix_cache_queries", "Prompt tokens looked up in the prefix cache.",
                      s.get("prefix_cache_queries"))
        yield counter("zg_prefix_cache_hits", "Prompt tokens found in the prefix cache.", s.get("prefix_cache_hits"))
        yield counter("zg_num_preemptions", "Sequences preempted (recompute).", s.get("num_preemptions"))
        if s.get("sm_util") is not None:
            yield gauge("zg_gpu_sm_util", "GPU SM utilisation as reported by the engine.", s["sm_util"])
        if s.get("vram_free_gb") is not None:
            yield gauge("zg_gpu_vram_free_gb", "Free GPU memory (GB).", s["vram_free_gb"])
        for name, value in self._extra().items():
            yield gauge(name, name.replace("_", " "), value)


class ServerMetrics:
    def __init__(self, model: str, stats: Callable[[], dict[str, Any]],
                 extra: Callable[[], dict[str, float]] | None = None) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        r = self.registry
        lab = ["model_name"]
        self.ttft = Histogram("zg_time_to_first_token_seconds", "Arrival to first token.", lab,
                              buckets=TTFT_BUCKETS, registry=r).labels(model)
        self.itl = Histogram("zg_inter_token_latency_seconds", "Gap between successive tokens.", lab,
                             buckets=ITL_BUCKETS, registry=r).labels(model)
        self.queue = Histogram("zg_request_queue_time_seconds", "Arrival to first scheduled.", lab,
                               buckets=E2E_BUCKETS, registry=r).labels(model)
        self.e2e = Histogram("zg_e2e_request_latency_seconds", "Arrival to finish.", lab,
                             buckets=E2E_BUCKETS, registry=r).labels(model)
        self.prompt_tokens = Counter("zg_prompt_tokens", "Prompt tokens processed.", lab, registry=r).labels(model)
        self.generation_tokens = Counter("zg_generation_tokens", "Tokens generated.", lab,
                                         registry=r).labels(model)
        self._success = Counter("zg_request_success", "Finished requests by finish reason.",
                                ["model_name", "finished_reason"], registry=r)
        self._errors = Counter("zg_request_errors", "Error answers by error type.",
                               ["model_name", "error_type"], registry=r)
        self._model = model
        self._success_children: dict[str, Any] = {}
        self._error_children: dict[str, Any] = {}
        r.register(_EngineCollector(stats, model, extra or dict))

    def observe_finished(self, timings: Any, usage: Any, finish_reason: str | None) -> None:
        """One finished request (any finish reason): histograms, token counters, finish counter."""
        reason = finish_reason or "abort"
        child = self._success_children.get(reason)
        if child is None:
            child = self._success_children[reason] = self._success.labels(self._model, reason)
        child.inc()
        if usage is not None:
            self.prompt_tokens.inc(usage.prompt_tokens)
            self.generation_tokens.inc(usage.completion_tokens)
        if timings is None:
            return
        if timings.first_scheduled_s is not None:
            self.queue.observe(timings.queue_ms / 1e3)
        ttft = timings.ttft_ms
        if ttft is not None:
            self.ttft.observe(ttft / 1e3)
        times = timings.token_times_s
        for a, b in zip(times, times[1:], strict=False):
            self.itl.observe(b - a)
        self.e2e.observe(timings.total_ms / 1e3)

    def observe_error(self, error_type: str) -> None:
        child = self._error_children.get(error_type)
        if child is None:
            child = self._error_children[error_type] = self._errors.labels(self._model, error_type)
        child.inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)

"""Prometheus metrics (``zg_`` prefix, vLLM-like names) on a per-server registry.

Histograms are observed once per finished request on the I/O loop (the inter-token
gaps come from the request's token timestamps), so the per-token path does no metric
work, and they are plain lists (one thread writes them) rendered at scrape time. Engine gauges (running, waiting, KV use, prefix cache) are read from
``engine.stats()`` at scrape time.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

CONTENT_TYPE = b"text/plain; version=0.0.4; charset=utf-8"

# Same spirit as vLLM's buckets: fine at the low end, where a fused path lives.
TTFT_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5,
                0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0)
ITL_BUCKETS = (0.0001, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2,
               0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0)
E2E_BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0,
               15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0)


class _EngineCollector(Collector):
    def __init__(self, stats: Callable[[], dict[str, Any]], model: str, extra: Callable[[], dict[str, float]],
                 kernels: str | None = None, kernel_isa: str | None = None):
        self._stats = stats
        self._model = model
        self._extra = extra
        self._kernels = kernels
        self._kernel_isa = kernel_isa

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
        yield gauge("zg_num_requests_held", "Streams left out of the batch (seated or parked): their client is far behind.",
                    s.get("held"))
        yield gauge("zg_kv_cache_usage_perc", "KV pool use, 0..1.", s.get("kv_util"))
        yield gauge("zg_kv_blocks_used", "KV blocks in use.", s.get("kv_blocks_used"))
        yield gauge("zg_kv_blocks_total", "KV blocks in the pool.", s.get("kv_blocks_total"))
        yield counter("zg_prefix_cache_queries", "Prompt tokens looked up in the prefix cache.",
                      s.get("prefix_cache_queries"))
        yield counter("zg_prefix_cache_hits", "Prompt tokens found in the prefix cache.", s.get("prefix_cache_hits"))
        yield counter("zg_num_preemptions", "Sequences preempted (recompute).", s.get("num_preemptions"))
        yield counter("zg_engine_steps", "Engine steps run (schedule, execute, postprocess).", s.get("num_steps"))
        yield counter("zg_engine_step_sequences", "Sequences computed, summed over the engine's steps: its rate over "
                      "zg_engine_steps_total's is the mean batch size.", s.get("num_step_seqs"))
        yield gauge("zg_engine_stalled_seconds", "Seconds the engine has had work but run no step (0: progressing "
                    "or idle); /health says degraded past its threshold.", s.get("stalled_s"))
        if s.get("sm_util") is not None:
            yield gauge("zg_gpu_sm_util", "GPU SM utilisation as reported by the engine.", s["sm_util"])
        if s.get("vram_free_gb") is not None:
            yield gauge("zg_gpu_vram_free_gb", "Free GPU memory (GB).", s["vram_free_gb"])
        for name, value in self._extra().items():
            yield gauge(name, name.replace("_", " "), value)
        if s.get("cuda_graphs") is not None:  # engine/cuda_runner.py graph_status: "on: ..." | "off: why"
            g = GaugeMetricFamily("zg_engine_cuda_graphs_enabled", "1 when decode steps replay CUDA graphs, 0 when "
                                  "off (the state label says why: --cuda-graphs off, a failed capture).",
                                  labels=["model_name", "state"])
            g.add_metric([self._model, s["cuda_graphs"]], 1.0 if s["cuda_graphs"].startswith("on") else 0.0)
            yield g
            yield counter("zg_engine_graph_replays", "Decode steps replayed from a CUDA graph.", s.get("graph_replays"))
        if self._kernels is not None:  # engine/cpu_kernels.py engine_status: "on" | "off: why" | "partial: ..."
            k = GaugeMetricFamily("zg_engine_kernels_enabled", "1 when the engine computes on its C kernels, 0 when "
                                  "off or partial (the state label says why).", labels=["model_name", "state"])
            k.add_metric([self._model, self._kernels], 1.0 if self._kernels == "on" else 0.0)
            yield k
        if self._kernel_isa is not None:  # engine/cpu_kernels.py engine_isa: the variant loaded
            i = GaugeMetricFamily("zg_engine_kernel_isa", "1, labelled with the ISA variant the C kernels were built "
                                  "for (avx2 | avx512 | avx512bf16), chosen once from the CPU's flags.",
                                  labels=["model_name", "isa"])
            i.add_metric([self._model, self._kernel_isa], 1.0)
            yield i


class _Histogram:
    """Lock-free histogram: only the I/O loop thread observes, so no mutex per sample
    (prometheus_client takes one per observe, which showed in profiles)."""

    __slots__ = ("buckets", "counts", "sum")

    def __init__(self, buckets: tuple[float, ...]) -> None:
        self.buckets = buckets
        self.counts = [0] * (len(buckets) + 1)
        self.sum = 0.0

    def observe(self, v: float) -> None:
        self.counts[bisect_left(self.buckets, v)] += 1
        self.sum += v

    def family(self, name: str, doc: str, model: str) -> HistogramMetricFamily:
        acc = 0
        cum = []
        for bound, n in zip((*self.buckets, float("inf")), self.counts, strict=True):
            acc += n
            cum.append((floatToGoString(bound), acc))
        fam = HistogramMetricFamily(name, doc, labels=["model_name"])
        fam.add_metric([model], cum, self.sum)
        return fam


class ServerMetrics:
    """Request metrics, observed once per finished request on the I/O loop."""

    def __init__(self, model: str, stats: Callable[[], dict[str, Any]],
                 extra: Callable[[], dict[str, float]] | None = None, kernels: str | None = None,
                 kernel_isa: str | None = None) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self._model = model
        self.ttft = _Histogram(TTFT_BUCKETS)
        self.itl = _Histogram(ITL_BUCKETS)
        self.queue = _Histogram(E2E_BUCKETS)
        self.e2e = _Histogram(E2E_BUCKETS)
        self.prompt_tokens = 0
        self.generation_tokens = 0
        self.finished: dict[str, int] = {}
        self.errors: dict[str, int] = {}
        self.registry.register(_EngineCollector(stats, model, extra or dict, kernels, kernel_isa))
        self.registry.register(_RequestCollector(self))

    def observe_finished(self, timings: Any, usage: Any, finish_reason: str | None) -> None:
        """One finished request (any finish reason): histograms, token counters, finish counter."""
        reason = finish_reason or "abort"
        finished = self.finished
        finished[reason] = finished.get(reason, 0) + 1
        if usage is not None:
            self.prompt_tokens += usage.prompt_tokens
            self.generation_tokens += usage.completion_tokens
        if timings is None:
            return
        # the RequestTimings properties' arithmetic and _Histogram.observe, inlined (same values)
        arrival = timings.arrival_s
        if timings.first_scheduled_s is not None:
            h = self.queue
            v = (timings.first_scheduled_s - arrival) * 1e3 / 1e3
            h.counts[bisect_left(h.buckets, v)] += 1
            h.sum += v
        if timings.first_token_s is not None:
            h = self.ttft
            v = (timings.first_token_s - arrival) * 1e3 / 1e3
            h.counts[bisect_left(h.buckets, v)] += 1
            h.sum += v
        times = timings.token_times_s
        if len(times) > 1:       # one bisect per gap, no call per token
            h = self.itl
            buckets, counts = h.buckets, h.counts
            prev = times[0]
            total = h.sum
            for t in times[1:]:
                v = t - prev
                counts[bisect_left(buckets, v)] += 1
                total += v
                prev = t
            h.sum = total
        h = self.e2e
        v = timings.total_ms / 1e3
        h.counts[bisect_left(h.buckets, v)] += 1
        h.sum += v

    def observe_error(self, error_type: str) -> None:
        self.errors[error_type] = self.errors.get(error_type, 0) + 1

    def render(self) -> bytes:
        return generate_latest(self.registry)


class _RequestCollector(Collector):
    def __init__(self, m: ServerMetrics) -> None:
        self._m = m

    def collect(self) -> Iterator[Metric]:
        m = self._m
        model = m._model
        yield m.ttft.family("zg_time_to_first_token_seconds", "Arrival to first token.", model)
        yield m.itl.family("zg_inter_token_latency_seconds", "Gap between successive tokens.", model)
        yield m.queue.family("zg_request_queue_time_seconds", "Arrival to first scheduled.", model)
        yield m.e2e.family("zg_e2e_request_latency_seconds", "Arrival to finish.", model)
        for name, doc, value in (("zg_prompt_tokens", "Prompt tokens processed.", m.prompt_tokens),
                                 ("zg_generation_tokens", "Tokens generated.", m.generation_tokens)):
            c = CounterMetricFamily(name, doc, labels=["model_name"])
            c.add_metric([model], value)
            yield c
        fin = CounterMetricFamily("zg_request_success", "Finished requests by finish reason.",
                                  labels=["model_name", "finished_reason"])
        for reason, n in sorted(m.finished.items()):
            fin.add_metric([model, reason], n)
        yield fin
        err = CounterMetricFamily("zg_request_errors", "Error answers by error type.",
                                  labels=["model_name", "error_type"])
        for etype, n in sorted(m.errors.items()):
            err.add_metric([model, etype], n)
        yield err

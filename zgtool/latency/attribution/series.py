"""The server's metrics under one vocabulary: each engine's and gateway's Prometheus names mapped to the few
series a reader of a latency run needs (issue 39 item 3). A Scrape (zgtool.latency.attribution.scrape) becomes
a reading {series: value}; counters become rates between two readings.

    waiting              requests queued, not yet scheduled       (gauge)
    running              requests in the running batch            (gauge)
    kv_usage             KV cache in use, 0..1                    (gauge)
    prefix_hit_tokens_s  prompt tokens found in the prefix cache per second (counter rate)
    prefix_hit_rate      the engine's own hit-rate gauge, 0..1 (SGLang)
    output_tokens_s      tokens generated per second              (counter rate, or the engine's gauge)
    requests_s           requests answered per second (gateways)  (counter rate)
    gpu_util             GPU utilisation, 0..1                    (gauge)

Names, with where they are documented:
  zgtool serve   engine/server/metrics.py (zg_*, vLLM-like)
  vLLM           docs/design/metrics.md: vllm:num_requests_waiting/running, vllm:kv_cache_usage_perc (older
                 vllm:gpu_cache_usage_perc), counters vllm:prefix_cache_hits, vllm:generation_tokens
  SGLang         docs/references/production_metrics.md: sglang:num_queue_reqs, sglang:num_running_reqs,
                 sglang:token_usage, sglang:cache_hit_rate, sglang:gen_throughput (tokens/s gauge)
  TGI            huggingface.co/docs/text-generation-inference/reference/metrics: tgi_queue_size,
                 tgi_batch_current_size, tgi_request_generated_tokens (histogram: its _sum counts tokens)
  llama.cpp      tools/server README (--metrics): llamacpp:requests_deferred, llamacpp:requests_processing,
                 llamacpp:kv_cache_usage_ratio, llamacpp:tokens_predicted_total
  LiteLLM        docs.litellm.ai/docs/proxy/prometheus: litellm_requests_metric, litellm_output_tokens_metric
  pygw           zgtool/gateway/pygw_metrics.py: pygw_requests_total
  dcgm-exporter  etc/default-counters.csv: DCGM_FI_DEV_GPU_UTIL (%)
"""

from __future__ import annotations

from dataclasses import dataclass

from zgtool.latency.attribution.scrape import Scrape

SERIES = ("waiting", "running", "kv_usage", "prefix_hit_tokens_s", "prefix_hit_rate", "output_tokens_s",
          "requests_s", "gpu_util")
UNITS = {"waiting": "requests", "running": "requests", "kv_usage": "0..1", "prefix_hit_tokens_s": "tokens/s",
         "prefix_hit_rate": "0..1", "output_tokens_s": "tokens/s", "requests_s": "requests/s", "gpu_util": "0..1"}


@dataclass(frozen=True)
class Name:
    series: str
    metric: str            # the exposition's sample name (a counter: without _total; both spellings are read)
    counter: bool = False  # a rate between readings, not a level
    scale: float = 1.0     # to the series' unit (DCGM's percent -> 0..1)


# engine -> its names; the first engine whose names a scrape carries names the source
ENGINES: dict[str, tuple[Name, ...]] = {
    "zgtool": (Name("waiting", "zg_num_requests_waiting"), Name("running", "zg_num_requests_running"),
               Name("kv_usage", "zg_kv_cache_usage_perc"),
               Name("prefix_hit_tokens_s", "zg_prefix_cache_hits", counter=True),
               Name("output_tokens_s", "zg_generation_tokens", counter=True),
               Name("gpu_util", "zg_gpu_sm_util", scale=0.01)),     # NVML's percent (engine/server/admission.py)
    "vLLM": (Name("waiting", "vllm:num_requests_waiting"), Name("running", "vllm:num_requests_running"),
             Name("kv_usage", "vllm:kv_cache_usage_perc"), Name("kv_usage", "vllm:gpu_cache_usage_perc"),
             Name("prefix_hit_tokens_s", "vllm:prefix_cache_hits", counter=True),
             Name("output_tokens_s", "vllm:generation_tokens", counter=True)),
    "SGLang": (Name("waiting", "sglang:num_queue_reqs"), Name("running", "sglang:num_running_reqs"),
               Name("kv_usage", "sglang:token_usage"), Name("prefix_hit_rate", "sglang:cache_hit_rate"),
               Name("output_tokens_s", "sglang:gen_throughput")),
    "TGI": (Name("waiting", "tgi_queue_size"), Name("running", "tgi_batch_current_size"),
            Name("output_tokens_s", "tgi_request_generated_tokens_sum", counter=True)),
    "llama.cpp": (Name("waiting", "llamacpp:requests_deferred"), Name("running", "llamacpp:requests_processing"),
                  Name("kv_usage", "llamacpp:kv_cache_usage_ratio"),
                  Name("output_tokens_s", "llamacpp:tokens_predicted", counter=True)),
    "LiteLLM": (Name("requests_s", "litellm_requests_metric", counter=True),
                Name("output_tokens_s", "litellm_output_tokens_metric", counter=True)),
    "pygw": (Name("requests_s", "pygw_requests", counter=True),),
    "dcgm-exporter": (Name("gpu_util", "DCGM_FI_DEV_GPU_UTIL", scale=0.01),),
}


@dataclass(frozen=True)
class Reading:
    """One scrape in the series' vocabulary: levels as they were, counters as raw totals (rates come from two
    readings: `rates`)."""

    t_s: float
    engine: str | None
    levels: dict[str, float]
    totals: dict[str, float]


def _value(scrape: Scrape, metric: str, counter: bool) -> float | None:
    if counter:
        total = scrape.value(metric + "_total")
        total = total if total is not None else scrape.value(metric)
        # a labelled counter nothing has counted yet is declared (# TYPE) without a sample: it is 0
        return 0.0 if total is None and (metric in scrape.types or metric + "_total" in scrape.types) else total
    return scrape.value(metric)


def engine_of(scrape: Scrape) -> str | None:
    """The engine or gateway whose names this scrape carries (None: none of ours)."""
    present = {s.name for s in scrape.samples} | set(scrape.types)
    for engine, names in ENGINES.items():
        for n in names:
            if n.metric in present or (n.counter and n.metric + "_total" in present):
                return engine
    return None


def read(scrape: Scrape, engine: str | None = None) -> Reading:
    """The scrape's values under the series' names (engine: as found before, else detected now)."""
    engine = engine or engine_of(scrape)
    levels: dict[str, float] = {}
    totals: dict[str, float] = {}
    for n in ENGINES.get(engine or "", ()):
        v = _value(scrape, n.metric, n.counter)
        if v is None:
            continue
        if n.counter:
            totals.setdefault(n.series, v * n.scale)
        else:
            levels.setdefault(n.series, v * n.scale)
    return Reading(scrape.t_s, engine, levels, totals)


def rates(before: Reading, after: Reading) -> dict[str, float]:
    """Each counter's increase per second between two readings; a counter that went down (a restart) gives none."""
    dt = after.t_s - before.t_s
    if dt <= 0:
        return {}
    out = {}
    for series, total in after.totals.items():
        prev = before.totals.get(series)
        if prev is not None and total >= prev:
            out[series] = (total - prev) / dt
    return out

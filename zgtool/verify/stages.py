"""The measuring steps of a verify run; each returns a versioned result (zgtool.results) or raises.

Each step calls the other parts' Python APIs (probes, latency-split, k6 bench) with the run's
plan; the `command` written into each result is the equivalent stand-alone zgtool command.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from zgtool.results import make_result
from zgtool.targets import Target
from zgtool.verify.plan import Plan, SplitRun, VerifyConfig

CACHE_PROMPT = "Say hello in one short sentence."


def probe_path(target: Target, plan: Plan) -> dict[str, Any]:
    from zgtool.probes.combined import probe_all

    data = probe_all(target, timeout_s=plan.timeout_s or 10.0, max_tokens=plan.probe_max_tokens)
    return make_result("probe.all", data, target=target.public(),
                       command=f"zgtool probe --target {target.url} --max-tokens {plan.probe_max_tokens}")


def prompt_of(text: str) -> tuple[str, str]:
    """--prompt: a preset name (short, medium, long) or the prompt's own text -> (text, name)."""
    from zgtool.latency.config import PROMPTS

    return (PROMPTS[text], text) if text in PROMPTS else (text, "custom")


def latency_split(targets: list[Target], run: SplitRun, plan: Plan, vcfg: VerifyConfig | None = None,
                  cpu_groups: dict[str, int] | None = None) -> dict[str, Any]:
    """Both paths measured in alternating rounds; with `cpu_groups` ({part: process-group leader pid}
    of the local stack) also each part's CPU ms per request."""
    from zgtool.errors import VerdictFailed
    from zgtool.latency.analysis.phases import analyse
    from zgtool.latency.config import Slo, SplitConfig
    from zgtool.latency.result import result_data
    from zgtool.latency.schedule.cputime import CpuWatch, available
    from zgtool.latency.schedule.runner import measure_targets

    vcfg = vcfg or VerifyConfig()
    text, name = prompt_of(vcfg.prompt)
    cfg = SplitConfig(num_requests=run.num_requests, concurrency=run.concurrency, warmup=plan.split_warmup,
                      stream=run.stream, prompt=text, prompt_name=name, max_tokens=plan.split_max_tokens,
                      rounds=plan.split_rounds, slo=Slo.parse(list(vcfg.slo)), quick=vcfg.quick,
                      family_size=len(plan.splits),   # the verdict picks among every configuration
                      workload=vcfg.workload(), timeout_s=plan.timeout_s or 30.0)
    from zgtool.latency.tokencount import count_for_config, token_counts

    cfg, counting = count_for_config(vcfg.tokenizer, list(targets), cfg)   # synthetic prompts to their exact lengths
    cpu = CpuWatch(cpu_groups) if cpu_groups and available() else None
    from zgtool.workload.split import watch_split

    pwatch, hooks = watch_split(targets, cfg)    # with --dataset: the engine's prefix-cache hit rate
    samples = measure_targets(targets, cfg, cpu=cpu, hooks=hooks)
    if pwatch is not None:
        pwatch.finish()
    res = analyse(targets, samples, cfg, cpu=cpu.per_request_ms() if cpu else None)
    dead = [t for t in res.targets if t.num_ok == 0]
    if dead:
        raise VerdictFailed("; ".join(f"{t.name}: all {t.num_error} requests failed ({', '.join(t.errors)})"
                                      for t in dead))
    urls = " ".join(t.url for t in targets)
    slo = f" --slo '{' '.join(vcfg.slo)}'" if vcfg.slo else ""
    prompt = f" --prompt {name}" if name != "custom" else ""
    command = (f"zgtool latency-split {urls} -n {run.num_requests} -c {run.concurrency} "
               f"--{'stream' if run.stream else 'no-stream'} --max-tokens {plan.split_max_tokens} "
               f"--warmup {plan.split_warmup} --rounds {cfg.effective_rounds}{prompt}{slo}"
               + (f" --dataset '{plan.dataset}'" if plan.dataset else "")
               + (f" --timeout-s {plan.timeout_s:g}" if plan.timeout_s else "")
               + (f" --tokenizer {vcfg.tokenizer}" if vcfg.tokenizer != "auto" else ""))
    data = result_data(res)
    data["token_counts"] = token_counts(counting, res, cfg.num_requests)[0]
    if pwatch is not None:
        data["prefix_cache"] = pwatch.result()
    return make_result("latency_split", data, target=[t.public() for t in targets], command=command)


def k6_bench(direct: Target, gateway: Target, plan: Plan, run_dir: Path) -> dict[str, Any]:
    """gateway, direct and direct_stream scenarios in turn; MissingCapability when k6 is absent."""
    from zgtool.loadtest.bench import run_bench
    from zgtool.loadtest.config import BenchConfig
    from zgtool.loadtest.k6bin import find_k6

    k6 = find_k6()
    run_dir.mkdir(parents=True, exist_ok=True)
    payload = run_dir / "payload.json"
    # the stock payload asks for 16 tokens; the plan keeps k6's share of the run short
    payload.write_text(json.dumps({"model": "default", "max_tokens": plan.k6_max_tokens,
                                   "messages": [{"role": "user", "content": CACHE_PROMPT}]}))
    if plan.dataset:   # the --dataset's bodies instead, sent in turn (zgtool.workload.k6)
        from zgtool.verify.plan import dataset_workload
        from zgtool.workload.k6 import write_payload

        wl = dataset_workload(plan.dataset)
        assert wl is not None
        payload = write_payload(wl, "anthropic", run_dir)    # BenchConfig's default API, as below
    cfg = BenchConfig(rate_rps=plan.k6_rate_rps, duration_s=plan.k6_duration_s, pre_allocated_vus=8,
                      max_vus=32, payload=payload, request_timeout_s=plan.timeout_s or 60.0)
    data = run_bench(cfg, direct=direct, gateway=gateway, k6=k6, run_dir=run_dir, progress=False)
    command = (f"zgtool bench --direct {direct.url} --gateway {gateway.url} --rate {plan.k6_rate_rps} "
               f"--duration {plan.k6_duration_s:g}s --payload {payload}"
               + (f" --timeout-s {plan.timeout_s:g}" if plan.timeout_s else ""))
    return make_result("bench.k6", data, target=direct.public(), command=command)


def engine_metrics(engine_url: str) -> dict[str, Any]:
    from zgtool.verify.engine_metrics import snapshot

    return make_result("engine.metrics", snapshot(engine_url), target={"url": engine_url},
                       command=f"curl {engine_url}/metrics; curl {engine_url}/admin/kv")


def cache_check(gateway: Target, plan: Plan) -> dict[str, Any]:
    """Send the run's own request (no temperature: what latency-split and k6 send) a few times
    through the gateway and read its x-cache answer: the hit rate this workload gets."""
    import httpx

    from zgtool.probes.servertiming import parse_server_timing

    body = {"model": gateway.model, "max_tokens": plan.split_max_tokens,
            "messages": [{"role": "user", "content": CACHE_PROMPT}]}
    seen: list[str | None] = []
    lookup_ms: list[float] = []
    with httpx.Client(timeout=plan.timeout_s or 30.0, headers=gateway.auth_headers()) as client:
        for _ in range(plan.cache_requests):
            resp = client.post(gateway.base_url + "/v1/messages", json=body)
            seen.append(resp.headers.get("x-cache"))
            for m in parse_server_timing(resp.headers.get("server-timing", "")):
                if m.name == "gw_cache" and m.dur_ms is not None:
                    lookup_ms.append(m.dur_ms)
    answered = [s for s in seen if s is not None]
    hits = sum(1 for s in answered if s.upper().startswith("HIT"))
    return {"path": gateway.name, "requests": len(seen), "answers_with_x_cache": len(answered), "hits": hits,
            "hit_rate": hits / len(answered) if answered else None, "x_cache": seen,
            "gw_cache_ms": lookup_ms,
            "note": "the measured workload's own request (no temperature=0, so pygw does not cache it)"}

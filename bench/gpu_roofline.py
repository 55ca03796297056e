"""Decode speed of zgtool's CUDA step against the HBM roofline, beside transformers compiled
with a static cache (the gpt-fast method), and cold TTFT at 512 tokens. Issue 35.

A decode step reads every weight once (the lm_head once; the embedding only for the batch's
rows) and every running sequence's KV cache once, so at batch B its best possible speed is

    roofline tok/s = B * bandwidth / (weight bytes + B * avg context * KV bytes per token)

against two bandwidths: NVML's (bus width x max memory clock x 2, else a datasheet table) and a
measured device-to-device copy (bytes read + written per second, timed with CUDA events; the
earlier copy_bandwidth() counted read + write and then halved it again, which is how an H200 rated
4.8 TB/s printed 2.1).

For each preset (`llama-1b`, and `llama-8b` with Llama-3.1-8B's shapes, its seeded bf16 weights
made on the device) and batch (1, 16, 64): a warm-up at that batch, then N decode steps each timed
on the host (the engine's per-token time: schedule, the step, postprocess) and with CUDA events;
p50/p99 step time, tok/s = B / p50, % of both roofline figures, the GPU clocks before and after.
Beside it, in the same run, transformers on the very same weights (copied out of our model) with
`cache_implementation="static"` and `torch.compile(mode="reduce-overhead")` (`--hf-batches`,
llama-1b only; its step time from the gaps between the tokens one generate call streams), and TTFT
of cold (never cached) 512-token prompts.

    python bench/gpu_roofline.py [--presets llama-1b,llama-8b] [--batches 1,16,64] [--steps 64]
                                 [--hf-batches 1,16] [--cuda-graphs on|off]
    python bench/gpu_roofline.py --dry-run    # CPU: the same path on dummy:tiny, no figures of note

Without CUDA (and no --dry-run) it prints "not run: no CUDA device" and exits 4. Last line: one
JSON object with every figure, each row naming its preset, and target_met over the issue's targets.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import time
from typing import Any

# datasheet HBM/GDDR bandwidth in bytes/s, by a substring of the NVML device name
BANDWIDTH_TABLE_BPS: dict[str, float] = {
    "H200": 4.8e12, "H100 NVL": 3.9e12, "H100 PCIe": 2.0e12, "H100": 3.35e12, "GH200": 4.0e12,
    "A100-SXM4-80GB": 2.039e12, "A100 80GB PCIe": 1.935e12, "A100": 1.555e12, "L40S": 0.864e12,
    "L40": 0.864e12, "L4": 0.3e12, "A10G": 0.6e12, "A10": 0.6e12, "T4": 0.32e12, "V100": 0.9e12,
    "RTX 4090": 1.008e12, "RTX 3090": 0.936e12,
}

PROMPT_LEN = 32
TTFT_PROMPT = 512
# % of the NVML roofline (issue 35's targets), and the cold 512-token TTFT in ms
TARGET_PCT: dict[tuple[str, int], float] = {("llama-8b", 1): 70, ("llama-1b", 1): 50, ("llama-1b", 16): 40,
                                            ("llama-1b", 64): 40}
TARGET_TTFT_MS: dict[str, float] = {"llama-1b": 10}
TARGET_VS_HF: dict[tuple[str, int], float] = {("llama-1b", 1): 1.5, ("llama-1b", 16): 1.0, ("llama-1b", 64): 1.0}


def bandwidth(name: str) -> tuple[float | None, str]:
    """(bytes/s, where it came from): NVML's bus width and max memory clock, else the table."""
    try:
        import pynvml

        pynvml.nvmlInit()
        h = pynvml.nvmlDeviceGetHandleByIndex(0)
        bus_bits = pynvml.nvmlDeviceGetMemoryBusWidth(h)
        mem_mhz = pynvml.nvmlDeviceGetMaxClockInfo(h, pynvml.NVML_CLOCK_MEM)
        if bus_bits and mem_mhz:
            return bus_bits / 8 * mem_mhz * 1e6 * 2, f"NVML: {bus_bits}-bit bus x {mem_mhz} MHz x 2"
    except Exception:  # noqa: BLE001 - fall back to the table
        pass
    for key in sorted(BANDWIDTH_TABLE_BPS, key=len, reverse=True):
        if key in name:
            return BANDWIDTH_TABLE_BPS[key], f"datasheet table ({key})"
    return None, "unknown device: no bandwidth"


def clocks() -> dict[str, Any]:
    """The GPU's SM and memory clocks now and at most (MHz), NVML; {} where NVML is absent."""
    try:
        import pynvml

        pynvml.nvmlInit()
        h = pynvml.nvmlDeviceGetHandleByIndex(0)
        return {"sm_mhz": pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM),
                "mem_mhz": pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_MEM),
                "sm_max_mhz": pynvml.nvmlDeviceGetMaxClockInfo(h, pynvml.NVML_CLOCK_SM),
                "mem_max_mhz": pynvml.nvmlDeviceGetMaxClockInfo(h, pynvml.NVML_CLOCK_MEM)}
    except Exception:  # noqa: BLE001 - no NVML: no clocks, said by the empty dict
        return {}


def copy_bandwidth(nbytes: int = 1 << 30, reps: int = 20) -> float:
    """Device-to-device copy, bytes read + written per second (achievable HBM), CUDA events."""
    import torch

    a = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    b = torch.empty_like(a)
    for _ in range(5):
        b.copy_(a)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        b.copy_(a)
    end.record()
    end.synchronize()
    dt_s = start.elapsed_time(end) / 1e3 / reps
    del a, b
    torch.cuda.empty_cache()
    return 2 * nbytes / dt_s


def weight_bytes(spec: Any, elem_bytes: int = 2) -> int:
    """What a decode step reads of the weights: all of them, except an untied embedding table
    (only the batch's rows of it; the lm_head is read whole)."""
    untied_embed = 0 if spec.tie_word_embeddings else spec.vocab_size * spec.hidden_size
    return (spec.num_params() - untied_embed) * elem_bytes


def roofline_tok_s(spec: Any, batch: int, ctx: float, bw: float, elem_bytes: int = 2) -> float:
    kv_per_token = spec.num_layers * 2 * spec.num_kv_heads * spec.dim_per_head * elem_bytes
    return batch * bw / (weight_bytes(spec, elem_bytes) + batch * ctx * kv_per_token)


def pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(round(q / 100 * (len(s) - 1))))]


def prompts(n: int, length: int, vocab: int, seed: int) -> list[list[int]]:
    import random

    rng = random.Random(seed)
    return [[rng.randrange(300, vocab) for _ in range(length)] for _ in range(n)]


def make_engine(preset: str, device: str, max_batch: int, graphs: bool) -> Any:
    from zgtool.engine import Engine, EngineConfig

    return Engine(EngineConfig(model=f"dummy:{preset}", dtype="bfloat16" if device == "cuda" else "float32",
                               device=device, max_num_seqs=max_batch, max_num_batched_tokens=max(2048, TTFT_PROMPT),
                               max_model_len=1024, enable_prefix_caching=False, cuda_graphs=graphs,
                               kv_memory_bytes=(4 << 30) if device == "cuda" else (64 << 20)))


def decode_steps(engine: Any, batch: int, steps: int, warmup: int, seed: int) -> dict[str, Any]:
    """`batch` sequences prefilled, `warmup` decode steps, then `steps` timed ones: host wall time
    per step (the engine's per-token time) and CUDA-event time; how many replayed a graph."""
    import torch

    from zgtool.engine import SamplingParams

    cuda = torch.cuda.is_available() and engine.device.startswith("cuda")
    params = SamplingParams(max_tokens=warmup + steps + 2, temperature=0, ignore_eos=True)
    seqs = []
    for i, ids in enumerate(prompts(batch, PROMPT_LEN, engine.spec.vocab_size, seed)):
        seq = engine._new_seq(ids, params, f"roofline-{seed}-{i}", None)
        engine._seqs[seq.request_id] = seq
        engine.scheduler.add(seq)
        seqs.append(seq)
    while any(s.num_output_tokens == 0 for s in seqs):  # the prompts (eager steps)
        engine.step()
    for _ in range(warmup):
        engine.step()
    runner = engine.runner
    replays0 = getattr(runner, "graph_replays", 0)
    wall_ms, events = [], []
    for _ in range(steps):
        if cuda:
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            e0.record()
        t0 = time.perf_counter()
        engine.step()
        wall_ms.append((time.perf_counter() - t0) * 1e3)
        if cuda:
            e1.record()
            events.append((e0, e1))
    if cuda:
        torch.cuda.synchronize()
    ev_ms = [a.elapsed_time(b) for a, b in events]
    while any(not s.is_finished for s in seqs):
        engine.step()
    for s in seqs:
        engine._seqs.pop(s.request_id, None)
    p50 = statistics.median(wall_ms)
    return {"step_ms_p50": p50, "step_ms_p99": pct(wall_ms, 99), "event_step_ms_p50": statistics.median(ev_ms)
            if ev_ms else None, "event_step_ms_p99": pct(ev_ms, 99) if ev_ms else None,
            "tok_s": batch / (p50 / 1e3), "graph_steps": getattr(runner, "graph_replays", 0) - replays0,
            "steps": steps, "avg_ctx": PROMPT_LEN + warmup + steps / 2}


def ttft_cold(engine: Any, runs: int) -> float:
    """Median TTFT (ms) of never-cached TTFT_PROMPT-token prompts, one at a time, after one warm-up."""
    from zgtool.engine import SamplingParams

    out = []
    for i in range(runs + 1):
        r = engine.generate(prompts(1, TTFT_PROMPT, engine.spec.vocab_size, seed=100 + i)[0],
                            SamplingParams(max_tokens=1, temperature=0, ignore_eos=True))
        out.append(r.timings.ttft_ms)
    return statistics.median(out[1:])


def hf_state_dict(model: Any) -> dict[str, Any]:
    """Our LlamaModel's weights (fused qkv and gate_up, [out, in]) in transformers' naming: the peer
    runs the very same numbers."""
    spec = model.spec
    q_n, kv_n, inter = spec.num_heads * model.head_dim, spec.num_kv_heads * model.head_dim, spec.intermediate_size
    sd = {"model.embed_tokens.weight": model.embed, "model.norm.weight": model.norm}
    if not spec.tie_word_embeddings:
        sd["lm_head.weight"] = model.lm_head
    for i, lw in enumerate(model.layers):
        p = f"model.layers.{i}."
        sd.update({p + "input_layernorm.weight": lw.input_norm, p + "post_attention_layernorm.weight": lw.post_norm,
                   p + "self_attn.q_proj.weight": lw.qkv[:q_n], p + "self_attn.k_proj.weight": lw.qkv[q_n:q_n + kv_n],
                   p + "self_attn.v_proj.weight": lw.qkv[q_n + kv_n:], p + "self_attn.o_proj.weight": lw.o,
                   p + "mlp.gate_proj.weight": lw.gate_up[:inter], p + "mlp.up_proj.weight": lw.gate_up[inter:],
                   p + "mlp.down_proj.weight": lw.down})
    return sd


def hf_compiled_peer(model: Any) -> Any:
    """transformers' LlamaForCausalLM on our weights, static cache, forward compiled with
    mode="reduce-overhead" (CUDA graphs), fullgraph: the gpt-fast method as transformers documents it."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(**{k: v for k, v in model.spec.to_hf_config().items() if k != "architectures"})
    with torch.device("cuda"):
        hf = LlamaForCausalLM(cfg).to(torch.bfloat16).eval()
    missing, unexpected = hf.load_state_dict(hf_state_dict(model), strict=False)
    if unexpected or [m for m in missing if "rotary" not in m and m != "lm_head.weight"]:
        raise RuntimeError(f"peer weights: missing {missing}, unexpected {unexpected}")
    hf.generation_config.cache_implementation = "static"
    hf.forward = torch.compile(hf.forward, mode="reduce-overhead", fullgraph=True)
    return hf


class _Stamps:
    """A transformers streamer that only notes when each token arrived (generate hands it every
    token as it is sampled, after a device-to-host copy)."""

    def __init__(self) -> None:
        self.times_s: list[float] = []

    def put(self, value: Any) -> None:
        self.times_s.append(time.perf_counter())

    def end(self) -> None:
        pass


def hf_decode(hf: Any, batch: int, new_tokens: int, vocab: int) -> dict[str, float]:
    """The compiled peer's decode step: p50/p99 of the gaps between consecutive tokens of one
    generate call (one length throughout: a static cache of another length would compile again),
    after two warm-up calls at this batch (compile, CUDA-graph capture)."""
    import torch

    ids = torch.tensor(prompts(batch, PROMPT_LEN, vocab, seed=2), device="cuda")
    gen = dict(do_sample=False, pad_token_id=0, eos_token_id=None, max_new_tokens=new_tokens,
               min_new_tokens=new_tokens)
    with torch.inference_mode():
        for _ in range(2):
            hf.generate(ids, **gen)
        stamps = _Stamps()
        hf.generate(ids, streamer=stamps, **gen)
    gaps_ms = [(b - a) * 1e3 for a, b in zip(stamps.times_s[2:], stamps.times_s[3:], strict=False)]
    step_ms = statistics.median(gaps_ms)
    return {"hf_step_ms": step_ms, "hf_step_ms_p99": pct(gaps_ms, 99), "hf_tok_s": batch / (step_ms / 1e3)}


def preset_rows(preset: str, args: argparse.Namespace, device: str, bw: float | None,
                copy_bps: float | None) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Every batch of one preset (engine, then the peer on the same weights), and its TTFT."""
    import torch

    batches = [int(b) for b in args.batches.split(",")]
    engine = make_engine(preset, device, max(batches), args.cuda_graphs == "on")
    spec = engine.spec
    graphs = getattr(engine.runner, "graph_status", None)
    rows = []
    for b in batches:
        z = decode_steps(engine, b, args.steps, args.warmup, seed=b)
        row: dict[str, Any] = {"preset": preset, "batch": b, "zgtool_tok_s": z["tok_s"], **z}
        for key, bps in (("", bw), ("copy_", copy_bps)):
            roof = roofline_tok_s(spec, b, z["avg_ctx"], bps) if bps else None
            row[f"{key}roofline_tok_s"] = roof
            row[f"pct_of_{key}roofline"] = 100 * z["tok_s"] / roof if roof else None
        row["target_pct"] = TARGET_PCT.get((preset, b))
        rows.append(row)
    extra: dict[str, Any] = {"preset": preset, "cuda_graphs": graphs, "backend": engine.model.backend_name,
                             "ttft_512_ms": ttft_cold(engine, args.ttft_runs), "target_ttft_ms": TARGET_TTFT_MS.get(preset)}
    hf_batches = [int(b) for b in args.hf_batches.split(",") if b] if device == "cuda" else []
    if hf_batches and preset in args.hf_presets.split(","):
        try:
            hf = hf_compiled_peer(engine.model)
            for row in rows:
                if row["batch"] in hf_batches:
                    row.update(hf_decode(hf, row["batch"], args.hf_tokens, spec.vocab_size))
                    row["zgtool_vs_hf"] = row["zgtool_tok_s"] / row["hf_tok_s"]
                    row["target_vs_hf"] = TARGET_VS_HF.get((preset, row["batch"]))
            del hf
        except Exception as exc:  # noqa: BLE001 - the peer's failure is a figure missing, said so
            extra["hf_error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
    del engine
    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()
    return rows, extra


def targets(rows: list[dict[str, Any]], extras: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each of the issue's targets this run measured, with its figure and whether it was met."""
    out = []
    for r in rows:
        if r.get("target_pct") is not None and r.get("pct_of_roofline") is not None:
            out.append({"what": f"{r['preset']} batch {r['batch']} % of roofline", "target": r["target_pct"],
                        "value": r["pct_of_roofline"], "met": r["pct_of_roofline"] >= r["target_pct"]})
        if r.get("target_vs_hf") is not None and r.get("zgtool_vs_hf") is not None:
            out.append({"what": f"{r['preset']} batch {r['batch']} x compiled transformers", "target": r["target_vs_hf"],
                        "value": r["zgtool_vs_hf"], "met": r["zgtool_vs_hf"] >= r["target_vs_hf"]})
    for e in extras:
        if e.get("target_ttft_ms") is not None:
            out.append({"what": f"{e['preset']} cold {TTFT_PROMPT}-token TTFT ms", "target": e["target_ttft_ms"],
                        "value": e["ttft_512_ms"], "met": e["ttft_512_ms"] <= e["target_ttft_ms"]})
    return out


def render(name: str, bw: float | None, bw_src: str, copy_bps: float | None, rows: list[dict[str, Any]],
           extras: list[dict[str, Any]], checks: list[dict[str, Any]]) -> None:
    def f(v: float | None, fmt: str) -> str:
        return format(v, fmt) if v is not None else "-"

    print(f"{name}: bandwidth {f(bw and bw / 1e12, '.2f')} TB/s ({bw_src}); measured copy (read+write) "
          f"{f(copy_bps and copy_bps / 1e12, '.2f')} TB/s")
    print(f"{'preset':>9} {'batch':>5} {'tok/s':>9} {'p50 ms':>7} {'p99 ms':>7} {'ev p50':>7} {'% roof':>7} "
          f"{'% copy':>7} {'HF tok/s':>9} {'zg/HF':>6} {'graphs':>6}")
    for r in rows:
        print(f"{r['preset']:>9} {r['batch']:>5} {r['zgtool_tok_s']:>9.1f} {r['step_ms_p50']:>7.2f} "
              f"{r['step_ms_p99']:>7.2f} {f(r['event_step_ms_p50'], '7.2f')} {f(r['pct_of_roofline'], '6.1f')}% "
              f"{f(r['pct_of_copy_roofline'], '6.1f')}% {f(r.get('hf_tok_s'), '9.1f')} "
              f"{f(r.get('zgtool_vs_hf'), '6.2f')} {r['graph_steps']:>3}/{r['steps']}")
    for e in extras:
        print(f"{e['preset']}: {e['backend']}; CUDA graphs {e['cuda_graphs']}; cold {TTFT_PROMPT}-token TTFT "
              f"{e['ttft_512_ms']:.1f} ms" + (f"; transformers peer failed: {e['hf_error']}" if "hf_error" in e else ""))
    for c in checks:
        print(f"target {c['what']}: {c['value']:.2f} vs {c['target']} -> {'met' if c['met'] else 'MISSED'}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--presets", default="llama-1b,llama-8b")
    ap.add_argument("--batches", default="1,16,64")
    ap.add_argument("--steps", type=int, default=64, help="timed decode steps per batch")
    ap.add_argument("--warmup", type=int, default=8, help="untimed decode steps per batch first")
    ap.add_argument("--hf-batches", default="1,16", help="batches the compiled transformers peer runs ('' none)")
    ap.add_argument("--hf-presets", default="llama-1b")
    ap.add_argument("--hf-tokens", type=int, default=64)
    ap.add_argument("--ttft-runs", type=int, default=5)
    ap.add_argument("--cuda-graphs", choices=("on", "off"), default="on")
    ap.add_argument("--dry-run", action="store_true", help="CPU: the whole path on dummy:tiny, figures meaningless")
    args = ap.parse_args()
    import torch

    if args.dry_run:
        args.presets, args.batches, args.steps, args.warmup, args.ttft_runs = "tiny", "1,2", 4, 2, 1
        device = "cpu"
    elif not torch.cuda.is_available():
        print("gpu_roofline: not run: no CUDA device")
        print(json.dumps({"bench": "gpu_roofline", "skipped": "no CUDA device"}))
        return 4
    else:
        device = "cuda"
    name = torch.cuda.get_device_name(0) if device == "cuda" else "cpu (dry run)"
    bw, bw_src = bandwidth(name) if device == "cuda" else (None, "dry run: none")
    copy_bps = copy_bandwidth() if device == "cuda" else None
    clocks_before = clocks() if device == "cuda" else {}
    rows, extras = [], []
    for preset in args.presets.split(","):
        r, e = preset_rows(preset, args, device, bw, copy_bps)
        rows += r
        extras.append(e)
    checks = targets(rows, extras)
    render(name, bw, bw_src, copy_bps, rows, extras, checks)
    print(json.dumps({"bench": "gpu_roofline", "device": name, "dry_run": args.dry_run, "bandwidth_bps": bw,
                      "bandwidth_source": bw_src, "copy_bandwidth_bps": copy_bps, "clocks_before": clocks_before,
                      "clocks_after": clocks() if device == "cuda" else {}, "dtype": "bfloat16",
                      "prompt_tokens": PROMPT_LEN, "rows": rows, "presets": extras, "targets": checks,
                      "target_met": bool(checks) and all(c["met"] for c in checks)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())

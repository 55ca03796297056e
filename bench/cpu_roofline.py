"""How close c=1 decode gets to the box's memory bandwidth, measured in one run.

    .venv/bin/python bench/cpu_roofline.py [--threads N] [--tokens 64] [--rounds 3] [--models smollm2,dummy:small]

1. the box's bandwidth at the engine's thread count: a STREAM triad (a = b + s*c, counted as 3
   arrays moved) and a read-only sum, over 3 x 256 MB buffers (far larger than any cache), best
   of --rounds;
2. c=1 greedy decode tok/s of each model in fp32 and int8 (the in-process engine, prefill excluded),
   the bytes of weights one token reads (every layer projection, its scales and the lm_head), and
   so the achieved GB/s of weights read and its share of the measured bandwidth;
3. where a token's time goes: the layers' one C call, the lm_head + argmax call, and the Python
   around them (the engine step minus those two), and a separate microbenchmark of the paged
   attention over the run's average context (the share of the layers' call spent reading the KV).
Prints a table and, as its last line, one JSON object.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

from zgtool.engine import Engine, EngineConfig, SamplingParams
from zgtool.engine import cpu_kernels as ck
from zgtool.engine.config import server_threads

BUF_FLOATS = 64 * 2**20  # 256 MB per array


def bandwidth_gb_s(rounds: int) -> dict[str, float]:
    a, b, c = (torch.empty(BUF_FLOATS) for _ in range(3))
    b.fill_(1.0)
    c.fill_(2.0)
    a.fill_(0.0)
    triad, read = [], []
    for _ in range(rounds + 1):  # the first round pages the buffers in
        t0 = time.perf_counter()
        torch.add(b, c, alpha=3.0, out=a)
        triad.append(3 * 4 * BUF_FLOATS / (time.perf_counter() - t0) / 1e9)
        t0 = time.perf_counter()
        float(b.sum())
        read.append(4 * BUF_FLOATS / (time.perf_counter() - t0) / 1e9)
    return {"triad_gb_s": max(triad[1:]), "read_gb_s": max(read[1:])}


def tensor_bytes(obj: Any) -> int:
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if hasattr(obj, "q") and hasattr(obj, "scale"):  # Int8Weight
        return tensor_bytes(obj.q) + tensor_bytes(obj.scale)
    return 0


def weight_bytes_per_token(model: Any) -> int:
    """Every layer weight (projections, scales, biases, norms) and the lm_head: what one decode
    token reads at least once (the embedding lookup reads one row: left out)."""
    total = 0
    for lw in model.layers:
        fields = dataclasses.fields(lw) if dataclasses.is_dataclass(lw) else []
        total += sum(tensor_bytes(getattr(lw, f.name)) for f in fields)
    lm_q = getattr(model, "_lm_head_q", None) or getattr(model, "lm_head_q", None)
    total += tensor_bytes(lm_q) if lm_q is not None else tensor_bytes(model.lm_head)
    return total + tensor_bytes(getattr(model, "norm", None))


class Timer:
    """Wraps a bound method on an instance, summing its wall time (seconds) and calls."""

    def __init__(self, owner: Any, name: str) -> None:
        self.total_s, self.calls = 0.0, 0
        self.found = hasattr(owner, name)
        if self.found:
            inner: Callable[..., Any] = getattr(owner, name)

            def timed(*args: Any, **kwargs: Any) -> Any:
                t0 = time.perf_counter()
                try:
                    return inner(*args, **kwargs)
                finally:
                    self.total_s += time.perf_counter() - t0
                    self.calls += 1

            setattr(owner, name, timed)

    def reset(self) -> None:
        self.total_s, self.calls = 0.0, 0


def attention_ms(model: Any, ctx: int, threads: int, rounds: int = 20) -> float:
    """The paged attention kernel alone, one query over ctx positions, x the model's layers (ms)."""
    bs = 16
    nblk = -(-ctx // bs)
    kvh, d, h = model.num_kv_heads, model.head_dim, model.num_heads
    kc, vc = torch.randn(nblk * bs, kvh, d), torch.randn(nblk * bs, kvh, d)
    q, tables, lens = torch.randn(1, h, d), torch.arange(nblk).view(1, nblk), torch.tensor([ctx])
    torch.set_num_threads(threads)
    best = float("inf")
    for _ in range(rounds):
        t0 = time.perf_counter()
        ck.paged_decode_attention(q, kc, vc, tables, lens, bs, d ** -0.5)
        best = min(best, time.perf_counter() - t0)
    return best * 1e3 * len(model.layers)


def measure(model_name: str, dtype: str, threads: int, tokens: int, rounds: int, bw: dict[str, float]) -> dict[str, Any]:
    eng = Engine(EngineConfig(model=model_name, dtype=dtype, device="cpu", num_threads=threads, max_num_seqs=4,
                              enable_prefix_caching=False))
    model = eng.model
    step, layers = Timer(eng, "step"), Timer(model, "_layers_one_call")
    lm_head = Timer(model, "greedy_tokens")
    prompt = [[1 + (i % 200) for i in range(16)]]
    params = SamplingParams(max_tokens=tokens, temperature=0, ignore_eos=True)
    eng.generate(prompt, SamplingParams(max_tokens=4, temperature=0, ignore_eos=True))  # warm-up
    runs = []
    ck.library().pool_reset_counters()
    for _ in range(rounds):
        for t in (step, layers, lm_head):
            t.reset()
        t0 = time.perf_counter()
        res = eng.generate(prompt, params)
        dt = time.perf_counter() - t0
        prefill_s = res[0].timings.prefill_ms / 1e3
        n = len(res[0].output_token_ids) - 1
        runs.append({"tok_s": n / max(1e-9, dt - prefill_s), "steps": step.calls, "step_s": step.total_s,
                     "layers_s": layers.total_s, "layers_calls": layers.calls, "lm_s": lm_head.total_s})
    best = max(runs, key=lambda r: r["tok_s"])
    tok_s = statistics.median(r["tok_s"] for r in runs)
    wbytes = weight_bytes_per_token(model)
    achieved = wbytes * tok_s / 1e9
    per_step_ms = 1e3 * best["step_s"] / max(1, best["steps"])
    layers_ms = 1e3 * best["layers_s"] / max(1, best["steps"])
    lm_ms = 1e3 * best["lm_s"] / max(1, best["steps"])
    pool = ck.pool_counters_all(threads)
    attn_ms = attention_ms(model, len(prompt[0]) + tokens // 2, threads)
    return {
        "model": model_name, "dtype": dtype, "kernels": ck.engine_status(eng), "threads": threads,
        "decode_tok_s": round(tok_s, 2), "tok_s_rounds": [round(r["tok_s"], 2) for r in runs],
        "weight_mb_per_token": round(wbytes / 1e6, 2), "achieved_gb_s": round(achieved, 2),
        "share_of_triad": round(achieved / bw["triad_gb_s"], 3), "share_of_read": round(achieved / bw["read_gb_s"], 3),
        "step_ms": round(per_step_ms, 3), "layers_call_ms": round(layers_ms, 3) if layers.found else None,
        "lm_head_call_ms": round(lm_ms, 3) if lm_head.found else None,
        "python_between_ms": round(per_step_ms - layers_ms - lm_ms, 3),
        "attention_kernel_ms": round(attn_ms, 3),
        "layers_call_calls_per_step": round(best["layers_calls"] / max(1, best["steps"]), 2),
        # per pool thread (0: the caller): chunks and jobs run, and jobs run on the caller's own CPU
        # and jobs at whose start a worker found itself there and moved off (engine/csrc/pool.c)
        "pool_chunks": pool["chunks"], "pool_jobs": pool["jobs"], "pool_jobs_on_callers_cpu": pool["shared"],
        "pool_jobs_moved_off_callers_cpu": pool["moved"],
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=None, help="compute threads (default: the server's)")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--models", default="smollm2,dummy:small")
    args = ap.parse_args()
    threads = server_threads(args.threads)
    torch.set_num_threads(threads)
    load_before = os.getloadavg()[0]   # the conditions: a busy box reads lower on every figure
    bw = bandwidth_gb_s(args.rounds)
    print(f"bandwidth at {threads} thread(s): triad {bw['triad_gb_s']:.1f} GB/s, read {bw['read_gb_s']:.1f} GB/s")
    rows = []
    for name in args.models.split(","):
        for dtype in ("float32", "int8") if name == "smollm2" else ("float32",):
            r = measure(name, dtype, threads, args.tokens, args.rounds, bw)
            rows.append(r)
            print(f"{name:12} {dtype:8} {r['decode_tok_s']:7.1f} tok/s  {r['weight_mb_per_token']:7.1f} MB/token  "
                  f"{r['achieved_gb_s']:6.2f} GB/s = {100 * r['share_of_triad']:5.1f}% of triad "
                  f"({100 * r['share_of_read']:5.1f}% of read) | step {r['step_ms']:.2f} ms: layers call "
                  f"{r['layers_call_ms']} ms (attention kernel {r['attention_kernel_ms']} ms), lm_head "
                  f"{r['lm_head_call_ms']} ms, Python {r['python_between_ms']} ms  [kernels {r['kernels']}; pool jobs "
                  f"{r['pool_jobs']}, on the caller's CPU {r['pool_jobs_on_callers_cpu']}]")
    load = (round(load_before, 2), round(os.getloadavg()[0], 2))
    print(f"load average (1 min) before / after: {load[0]} / {load[1]} on {os.cpu_count()} CPUs")
    print(json.dumps({"bench": "cpu_roofline", "threads": threads, **{k: round(v, 2) for k, v in bw.items()},
                      "load_avg_1m_before_after": load, "cpus": os.cpu_count(), "results": rows}))


if __name__ == "__main__":
    main()

"""Steady-decode step time, A/B within one process: fp32 with torch ops only (MKL projections,
gather + SDPA attention, F.rms_norm, torch RoPE/KV write/silu: the engine before the C kernels),
then each C kernel added in turn (paged attention, add+RMSNorm, the lm_head GEMM, RoPE+KV write
and silu*mul, the projections on f32_gemm), and int8 weights with all of them; engines take turns
step by step, so load from other processes hits every variant alike. --threads sets the compute
threads of every variant (the C kernels share work through their own pool, MKL through OpenMP).

    .venv/bin/python bench/engine_decode_ab.py [--model dummy:small] [--batch 16] [--prompt 128] [--steps 30] [--threads 1]

Per variant: the median step (engine.step(), i.e. schedule + forward + logits + sample +
bookkeeping) in ms and tok/s; ratios against the first variant. Last line: one JSON object.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from zgtool.engine import Engine, EngineConfig, SamplingParams

# name -> (dtype, C attention kernel, C add+RMSNorm, C fp32 lm_head GEMM, C RoPE/KV + silu*mul,
#          C fp32 projections)
VARIANTS = {
    "fp32 torch only": ("float32", False, False, False, False, False),
    "fp32 +attn kernel": ("float32", True, False, False, False, False),
    "fp32 +attn +norm": ("float32", True, True, False, False, False),
    "fp32 +attn +norm +lm": ("float32", True, True, True, False, False),
    "fp32 +glue": ("float32", True, True, True, True, False),
    "fp32 +glue +gemm": ("float32", True, True, True, True, True),
    "int8 all kernels": ("int8", True, True, False, True, False),
}


def make_engine(model: str, dtype: str, kernel: bool, prompts: list[list[int]], norm: bool = True,
                lm: bool = True, glue: bool = True, gemm: bool = True, threads: int = 1) -> Engine:
    eng = Engine(EngineConfig(model=model, device="cpu", dtype=dtype, max_num_seqs=len(prompts),
                              max_num_batched_tokens=8192, enable_prefix_caching=False, num_threads=threads))
    assert eng.model is not None
    eng.model.attn_kernel = kernel
    eng.model.fast_norm = norm
    eng.model.fast_lm_head = lm and eng.model.fast_lm_head
    eng.model.fast_glue = glue and eng.model.fast_glue
    eng.model.f32_kernel = gemm and eng.model.f32_kernel  # off: MKL's F.linear on the same [out, in] weights
    params = SamplingParams(max_tokens=1024, temperature=0, ignore_eos=True)
    for i, p in enumerate(prompts):
        eng.scheduler.add(eng._new_seq(p, params, f"ab{i}", None))
    for _ in range(3):  # prefill, then decodes
        eng.step()
    return eng


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="dummy:small")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    # token ids in [262, 8000): valid for dummy:small's and SmolLM2's vocabularies
    prompts = [torch.randint(262, 8000, (args.prompt,), generator=torch.Generator().manual_seed(i)).tolist()
               for i in range(args.batch)]
    engines = {name: make_engine(args.model, dtype, kernel, prompts, norm, lm, glue, gemm, args.threads)
               for name, (dtype, kernel, norm, lm, glue, gemm) in VARIANTS.items()}
    times: dict[str, list[float]] = {n: [] for n in engines}
    for _ in range(args.steps):
        for name, eng in engines.items():
            t0 = time.perf_counter()
            eng.step()
            times[name].append((time.perf_counter() - t0) * 1e3)
    base = statistics.median(times["fp32 torch only"])
    print(f"{args.model}, batch {args.batch}, prompt {args.prompt}, {args.steps} interleaved steps, {args.threads} thread(s)")
    res = {}
    for name, t in times.items():
        med = statistics.median(t)
        res[name] = {"step_ms_p50": med, "tok_s": args.batch / med * 1e3, "speedup": base / med}
        print(f"{name:<20} step {med:7.2f} ms  {args.batch / med * 1e3:7.1f} tok/s  x{base / med:.2f}")
    print(json.dumps({"bench": "engine_decode_ab", "model": args.model, "batch": args.batch,
                      "prompt": args.prompt, "steps": args.steps, "threads": args.threads, "variants": res}))


if __name__ == "__main__":
    main()

"""Engine throughput vs Hugging Face transformers on the same dummy:small checkpoint.

    .venv/bin/python bench/engine_throughput.py [--requests 16] [--prompt 128] [--output 128]

Prints a table and, as its last line, one JSON object with the figures and ratios.
  1. output tok/s: zgtool (16 concurrent, continuous batching) vs HF generate one request
     at a time vs HF batched generate (left padding);
  2. zgtool decode step time vs a bare forward of the same batch (serving overhead %);
  3. TTFT of a request sharing a 512-token system prompt with a previous one vs cold;
  4. single-stream decode tok/s (batch 1), zgtool vs HF one at a time.
--threads sets torch's intra-op threads for every system (default: torch's own choice).
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import torch

from zgtool.engine import Engine, EngineConfig, SamplingParams
from zgtool.engine.weights import save_dummy_checkpoint

DTYPE = "float32"  # zgtool's dtype (--dtype int8: int8 weights, fp32 activations); HF always runs fp32


def make_prompts(n: int, length: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(1)
    return [[256, *torch.randint(262, 8000, (length - 1,), generator=g).tolist()] for _ in range(n)]


def ours_throughput(path: Path, prompts: list[list[int]], out_len: int, deterministic: bool = False) -> dict:
    eng = Engine(EngineConfig(model=str(path), device="cpu", dtype=DTYPE, max_num_seqs=len(prompts),
                              max_num_batched_tokens=2048, enable_prefix_caching=False,
                              deterministic=deterministic))
    params = SamplingParams(max_tokens=out_len, temperature=0, ignore_eos=True)
    eng.generate(prompts[:2], SamplingParams(max_tokens=4, temperature=0, ignore_eos=True))  # warm-up
    t0 = time.perf_counter()
    res = eng.generate(prompts, params)
    dt = time.perf_counter() - t0
    n = sum(len(r.output_token_ids) for r in res)
    return {"tok_s": n / dt, "seconds": dt, "tokens": n}


def step_overhead(path: Path, prompts: list[list[int]], steps: int = 20) -> dict:
    """engine.step() during steady decode (schedule, tensors, forward, sample, detokenize,
    bookkeeping) vs a bare forward + logits of the very same prepared batch."""
    eng = Engine(EngineConfig(model=str(path), device="cpu", dtype=DTYPE, max_num_seqs=len(prompts),
                              max_num_batched_tokens=4096, enable_prefix_caching=False))
    params = SamplingParams(max_tokens=1000, temperature=0, ignore_eos=True)
    for i, p in enumerate(prompts):
        eng.scheduler.add(eng._new_seq(p, params, f"b{i}", None))
    for _ in range(4):  # prefill, then a few decodes
        eng.step()
    captured: list = []
    orig_prepare = eng.runner.prepare

    def capture(batch):  # keep the step's own tensors to replay them bare
        captured.append(orig_prepare(batch))
        return captured[-1]

    eng.runner.prepare = capture
    step_ms, bare_ms = [], []
    for _ in range(steps):
        t0 = time.perf_counter()
        eng.step()
        step_ms.append((time.perf_counter() - t0) * 1e3)
        input_ids, meta, rows = captured.pop()
        t0 = time.perf_counter()
        with torch.inference_mode():
            h = eng.model.forward(input_ids, meta)
            eng.model.logits(h[torch.tensor(rows)])
        bare_ms.append((time.perf_counter() - t0) * 1e3)
    step_p50 = statistics.median(step_ms)
    bare_p50 = statistics.median(bare_ms)
    return {"batch": len(prompts), "step_ms_p50": step_p50, "bare_forward_ms_p50": bare_p50,
            "overhead_pct": (step_p50 - bare_p50) / bare_p50 * 100}


def prefix_ttft(path: Path, sys_len: int = 512) -> dict:
    eng = Engine(EngineConfig(model=str(path), device="cpu", dtype=DTYPE, max_num_batched_tokens=2048))
    g = torch.Generator().manual_seed(2)
    system = [256, *torch.randint(262, 8000, (sys_len - 1,), generator=g).tolist()]
    params = SamplingParams(max_tokens=1, temperature=0, ignore_eos=True)
    eng.generate([256, 5, 6, 7], params)  # warm-up
    cold, warm = [], []
    for i in range(3):
        other = [256, *torch.randint(262, 8000, (sys_len - 1,), generator=g).tolist()]
        c = eng.generate(other + [100 + i, 101, 102, 103], params)  # never seen: cold
        cold.append(c.timings.ttft_ms)
        eng.generate(system + [200 + i, 7, 8], params)  # a previous request with the system prompt
        w = eng.generate(system + [300 + i, 9, 10, 11], params)
        assert w.usage.cached_tokens >= sys_len - eng.block_size
        warm.append(w.timings.ttft_ms)
    c50, w50 = statistics.median(cold), statistics.median(warm)
    return {"system_prompt_tokens": sys_len, "cold_ttft_ms": c50, "warm_ttft_ms": w50, "speedup": c50 / w50,
            "hit_rate": eng.block_manager.prefix_hits / max(1, eng.block_manager.prefix_queries)}


def hf_throughput(path: Path, prompts: list[list[int]], out_len: int, batched: bool) -> dict:
    from transformers import LlamaForCausalLM

    model = LlamaForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    gen = dict(max_new_tokens=out_len, min_new_tokens=out_len, do_sample=False, pad_token_id=0, eos_token_id=None)
    with torch.inference_mode():
        model.generate(torch.tensor([prompts[0]]), max_new_tokens=4, do_sample=False, pad_token_id=0)
        t0 = time.perf_counter()
        if batched:
            width = max(len(p) for p in prompts)
            ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts])
            mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
            out = model.generate(ids, attention_mask=mask, **gen)
            n = (out.shape[1] - width) * len(prompts)
        else:
            n = 0
            for p in prompts:
                out = model.generate(torch.tensor([p]), **gen)
                n += out.shape[1] - len(p)
        dt = time.perf_counter() - t0
    return {"tok_s": n / dt, "seconds": dt, "tokens": n, "requests": len(prompts)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=16)
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--output", type=int, default=128)
    ap.add_argument("--det-output", type=int, default=32,
                    help="output tokens for the deterministic-mode cost comparison (0 skips it)")
    ap.add_argument("--threads", type=int, default=0, help="torch intra-op threads (0: torch's default)")
    ap.add_argument("--dtype", default="float32", choices=("float32", "int8"),
                    help="zgtool's dtype (int8: lossy, compare with HF fp32 knowing that)")
    ap.add_argument("--sequential-requests", type=int, default=3,
                    help="HF one-at-a-time is slow: its tok/s is measured on this many requests")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    global DTYPE
    DTYPE = args.dtype
    with tempfile.TemporaryDirectory(prefix="zg-bench-") as tmp:  # ~180 MB of weights: never left behind
        run(args, save_dummy_checkpoint("small", Path(tmp) / "dummy-small"))


def run(args: argparse.Namespace, path: Path) -> None:
    prompts = make_prompts(args.requests, args.prompt)

    ours = ours_throughput(path, prompts, args.output)
    ours_single = ours_throughput(path, prompts[:1], args.output)
    hf_seq = hf_throughput(path, prompts[: args.sequential_requests], args.output, batched=False)
    hf_bat = hf_throughput(path, prompts, args.output, batched=True)
    ovh = step_overhead(path, prompts)
    pfx = prefix_ttft(path)
    det = None
    if args.det_output:
        fast = ours_throughput(path, prompts, args.det_output)
        slow = ours_throughput(path, prompts, args.det_output, deterministic=True)
        det = {"normal_tok_s": fast["tok_s"], "deterministic_tok_s": slow["tok_s"],
               "cost_ratio": fast["tok_s"] / slow["tok_s"]}

    print(f"engine throughput, dummy:small ({args.requests} requests, prompt {args.prompt}, output {args.output}), "
          f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    print(f"{'system':<34}{'tok/s':>10}{'ratio':>10}")
    print(f"{'zgtool (continuous batching)':<34}{ours['tok_s']:>10.1f}{1.0:>10.2f}")
    print(f"{'zgtool, single stream':<34}{ours_single['tok_s']:>10.1f}"
          f"{ours_single['tok_s'] / hf_seq['tok_s']:>10.2f}x HF one at a time")
    print(f"{'HF generate, one at a time':<34}{hf_seq['tok_s']:>10.1f}{ours['tok_s'] / hf_seq['tok_s']:>10.2f}x")
    print(f"{'HF generate, batched (left pad)':<34}{hf_bat['tok_s']:>10.1f}{ours['tok_s'] / hf_bat['tok_s']:>10.2f}x")
    print(f"decode step (batch {ovh['batch']}): {ovh['step_ms_p50']:.2f} ms vs bare forward "
          f"{ovh['bare_forward_ms_p50']:.2f} ms -> serving overhead {ovh['overhead_pct']:.1f}%")
    print(f"TTFT with a shared {pfx['system_prompt_tokens']}-token system prompt: cold {pfx['cold_ttft_ms']:.1f} ms, "
          f"warm {pfx['warm_ttft_ms']:.1f} ms -> {pfx['speedup']:.1f}x")
    if det:
        print(f"deterministic mode ({args.det_output} output tokens): {det['deterministic_tok_s']:.1f} tok/s vs "
              f"{det['normal_tok_s']:.1f} tok/s normal -> costs x{det['cost_ratio']:.2f}")
    print(json.dumps({
        "bench": "engine_throughput", "model": "dummy:small",
        "threads": torch.get_num_threads(), "dtype": DTYPE,
        "ours_tok_s": ours["tok_s"], "ours_single_tok_s": ours_single["tok_s"],
        "single_ratio_vs_hf_sequential": ours_single["tok_s"] / hf_seq["tok_s"], "hf_sequential_tok_s": hf_seq["tok_s"], "hf_batched_tok_s": hf_bat["tok_s"],
        "ratio_vs_hf_sequential": ours["tok_s"] / hf_seq["tok_s"], "ratio_vs_hf_batched": ours["tok_s"] / hf_bat["tok_s"],
        "step_ms_p50": ovh["step_ms_p50"], "bare_forward_ms_p50": ovh["bare_forward_ms_p50"],
        "step_overhead_pct": ovh["overhead_pct"], "cold_ttft_ms": pfx["cold_ttft_ms"],
        "warm_ttft_ms": pfx["warm_ttft_ms"], "prefix_ttft_speedup": pfx["speedup"],
        "deterministic": det,
    }))


if __name__ == "__main__":
    main()

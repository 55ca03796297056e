"""Decode speed of the `llama-1b` preset on one GPU against the HBM roofline, and TTFT.

A decode step reads every weight once (the tied embedding once, as the LM head) and every
running sequence's KV cache once, so at batch B its best possible speed is

    roofline tok/s = B * bandwidth / (weight bytes + B * avg context * KV bytes per token)

with the bandwidth from NVML (bus width x max memory clock x 2) or a table of datasheet
figures. The bench prints zgtool's decode tok/s (bf16; batch 1, 16, 64) as % of that
bound, beside transformers' `generate` on the very same weights (a second system in the
same run), plus TTFT of a cold 512-token prompt. Target: >= 50% of roofline at batch 1.

    python bench/gpu_roofline.py [--batches 1,16,64] [--new-tokens 128] [--no-hf]

Without CUDA it prints "not run: no CUDA device" and exits 4 (missing capability).
Last line: one JSON object with every figure.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

# datasheet HBM/GDDR bandwidth in bytes/s, by a substring of the NVML device name
BANDWIDTH_TABLE_BPS: dict[str, float] = {
    "H200": 4.8e12, "H100 NVL": 3.9e12, "H100 PCIe": 2.0e12, "H100": 3.35e12, "GH200": 4.0e12,
    "A100-SXM4-80GB": 2.039e12, "A100 80GB PCIe": 1.935e12, "A100": 1.555e12, "L40S": 0.864e12,
    "L40": 0.864e12, "L4": 0.3e12, "A10G": 0.6e12, "A10": 0.6e12, "T4": 0.32e12, "V100": 0.9e12,
    "RTX 4090": 1.008e12, "RTX 3090": 0.936e12,
}

PRESET = "llama-1b"
PROMPT_LEN = 32
TTFT_PROMPT = 512


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


def copy_bandwidth() -> float:
    """Measured device-to-device copy, counting bytes read and written (achievable HBM)."""
    import torch

    a = torch.empty(2 * 1024**3, dtype=torch.uint8, device="cuda")
    b = torch.empty_like(a)
    for _ in range(3):
        b.copy_(a)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(10):
        b.copy_(a)
    torch.cuda.synchronize()
    dt = (time.perf_counter() - t0) / 10
    del a, b
    torch.cuda.empty_cache()
    return 2 * 2 * 1024**3 / dt


def prompts(n: int, length: int, vocab: int, seed: int = 0) -> list[list[int]]:
    import random

    rng = random.Random(seed)
    return [[rng.randrange(300, vocab) for _ in range(length)] for _ in range(n)]


def zgtool_decode(engine: Any, batch: int, new_tokens: int) -> dict[str, float]:
    """Steady decode: the median gap between consecutive tokens of the batch's sequences
    (every sequence advances once per step), so prefill is not in the figure."""
    from zgtool.engine import SamplingParams

    params = SamplingParams(max_tokens=new_tokens, temperature=0, ignore_eos=True)
    engine.generate(prompts(batch, PROMPT_LEN, engine.spec.vocab_size, seed=1), SamplingParams(
        max_tokens=8, temperature=0, ignore_eos=True))  # warm-up at this batch size
    res = engine.generate(prompts(batch, PROMPT_LEN, engine.spec.vocab_size, seed=2), params)
    gaps = [b - a for r in res for a, b in zip(r.timings.token_times_s[1:], r.timings.token_times_s[2:],
                                                strict=False)]
    step_s = statistics.median(gaps)
    return {"step_ms": step_s * 1e3, "tok_s": batch / step_s}


def zgtool_ttft(engine: Any, runs: int = 5) -> float:
    from zgtool.engine import SamplingParams

    out = []
    for i in range(runs + 1):
        r = engine.generate(prompts(1, TTFT_PROMPT, engine.spec.vocab_size, seed=100 + i)[0],
                            SamplingParams(max_tokens=1, temperature=0, ignore_eos=True))
        out.append(r.timings.ttft_ms)
    return statistics.median(out[1:])  # the first run warms the prefill shapes up


def hf_decode(path: Path, batch: int, new_tokens: int, vocab: int) -> float:
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16).eval().to("cuda")
    ids = torch.tensor(prompts(batch, PROMPT_LEN, vocab, seed=2), device="cuda")
    gen = dict(do_sample=False, pad_token_id=0, eos_token_id=None)
    with torch.inference_mode():
        model.generate(ids, max_new_tokens=4, min_new_tokens=4, **gen)

        def timed(n: int) -> float:
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            model.generate(ids, max_new_tokens=n, min_new_tokens=n, **gen)
            torch.cuda.synchronize()
            return time.perf_counter() - t0

        short, long = timed(8), timed(8 + new_tokens)
    return batch * new_tokens / (long - short)


def roofline_tok_s(spec: Any, batch: int, ctx: float, bw: float, elem_bytes: int = 2) -> float:
    weight_bytes = spec.num_params() * elem_bytes
    kv_per_token = spec.num_layers * 2 * spec.num_kv_heads * spec.dim_per_head * elem_bytes
    return batch * bw / (weight_bytes + batch * ctx * kv_per_token)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batches", default="1,16,64")
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--no-hf", action="store_true", help="skip the transformers side")
    args = ap.parse_args()
    import torch

    if not torch.cuda.is_available():
        print("gpu_roofline: not run: no CUDA device")
        print(json.dumps({"bench": "gpu_roofline", "skipped": "no CUDA device"}))
        return 4
    from zgtool.engine import Engine, EngineConfig

    batches = [int(b) for b in args.batches.split(",")]
    name = torch.cuda.get_device_name(0)
    bw, bw_src = bandwidth(name)
    copy_bps = copy_bandwidth()
    engine = Engine(EngineConfig(model=f"dummy:{PRESET}", dtype="bfloat16", device="cuda",
                                 max_num_seqs=max(batches), max_num_batched_tokens=max(4096, TTFT_PROMPT),
                                 enable_prefix_caching=False, kv_memory_bytes=8 * 1024**3))
    spec = engine.spec
    ctx = PROMPT_LEN + args.new_tokens / 2
    rows = []
    hf_dir = None
    tmp = tempfile.TemporaryDirectory(prefix="zg-roofline-")
    if not args.no_hf:
        from zgtool.engine.weights import save_dummy_checkpoint

        hf_dir = save_dummy_checkpoint(PRESET, Path(tmp.name) / PRESET)
    for b in batches:
        z = zgtool_decode(engine, b, args.new_tokens)
        roof = roofline_tok_s(spec, b, ctx, bw) if bw else None
        roof_copy = roofline_tok_s(spec, b, ctx, copy_bps / 2)  # copy counts read+write
        hf = hf_decode(hf_dir, b, args.new_tokens, spec.vocab_size) if hf_dir and b <= 16 else None
        torch.cuda.empty_cache()
        rows.append({"batch": b, "zgtool_tok_s": z["tok_s"], "step_ms": z["step_ms"],
                     "roofline_tok_s": roof, "pct_of_roofline": 100 * z["tok_s"] / roof if roof else None,
                     "pct_of_copy_roofline": 100 * z["tok_s"] / roof_copy,
                     "hf_tok_s": hf, "zgtool_vs_hf": z["tok_s"] / hf if hf else None})
    ttft = zgtool_ttft(engine)
    tmp.cleanup()

    print(f"{name}: bandwidth {bw / 1e12:.2f} TB/s ({bw_src}); measured copy {copy_bps / 2 / 1e12:.2f} TB/s"
          if bw else f"{name}: {bw_src}; measured copy {copy_bps / 2 / 1e12:.2f} TB/s")
    print(f"dummy:{PRESET} bf16, {spec.num_params() / 1e9:.2f} B params, prompt {PROMPT_LEN}, "
          f"{args.new_tokens} new tokens")
    print(f"{'batch':>5} {'zgtool tok/s':>13} {'step ms':>8} {'roofline':>9} {'% roof':>7} "
          f"{'% copy-roof':>11} {'HF tok/s':>9} {'zg/HF':>6}")
    for r in rows:
        def f(v: float | None, fmt: str) -> str:
            return format(v, fmt) if v is not None else "-"
        print(f"{r['batch']:>5} {r['zgtool_tok_s']:>13.1f} {r['step_ms']:>8.2f} {f(r['roofline_tok_s'], '9.0f')} "
              f"{f(r['pct_of_roofline'], '6.1f')}% {r['pct_of_copy_roofline']:>10.1f}% "
              f"{f(r['hf_tok_s'], '9.1f')} {f(r['zgtool_vs_hf'], '6.2f')}")
    b1 = next((r for r in rows if r["batch"] == 1), None)
    target_ok = bool(b1 and b1["pct_of_roofline"] is not None and b1["pct_of_roofline"] >= 50)
    print(f"TTFT, cold {TTFT_PROMPT}-token prompt: {ttft:.1f} ms (median of 5)")
    print(f"target >= 50% of roofline at batch 1: {'met' if target_ok else 'NOT met'}")
    print(json.dumps({"bench": "gpu_roofline", "device": name, "bandwidth_bps": bw, "bandwidth_source": bw_src,
                      "copy_bandwidth_bps": copy_bps / 2, "preset": PRESET, "dtype": "bfloat16",
                      "prompt_tokens": PROMPT_LEN, "new_tokens": args.new_tokens, "rows": rows,
                      "ttft_512_ms": ttft, "target_batch1_pct": 50, "target_met": target_ok}))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""How close c=1 decode gets to the box's memory bandwidth, measured in one run.

    .venv/bin/python bench/cpu_roofline.py [--threads N] [--tokens 64] [--rounds 3] [--models smollm2,dummy:small]
        [--dtypes float32,bfloat16,int8] [--isas avx2,avx512,avx512bf16]

1. the box's bandwidth at the engine's thread count: a STREAM triad (a = b + s*c, counted as 3
   arrays moved) and a read-only sum, over 3 x 256 MB buffers (far larger than any cache), best
   of --rounds;
2. c=1 greedy decode tok/s of each model in every dtype (fp32, bf16 weights, int8 weights) x every
   kernel ISA variant this CPU runs (engine/cpu_kernels.py VARIANTS, switched per round with
   ZGTOOL_KERNEL_ISA; the rounds alternate dtype and variant, so drift on a shared box hits them
   alike), the bytes of weights one token reads (every layer projection, its scales and the
   lm_head), and so the achieved GB/s of weights read and its share of the measured read bandwidth;
   then each variant's bf16 / fp32 and int8 / fp32 tok/s ratio (median of the per-round ratios);
   --dtypes may add int8-a8 (int8 weights and per-row int8 activations: vpdpbusd on avx512bf16);
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
from zgtool.engine.quant import INT8_ACTIVATIONS_ENV

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
    lm_q = getattr(model, "_lm_head_q", None) or getattr(model, "_lm_head_bf16", None)
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


class Subject:
    """One (model, dtype) engine, timed per round under whichever ISA variant is set."""

    def __init__(self, model_name: str, dtype: str, threads: int, tokens: int) -> None:
        self.model_name, self.dtype, self.threads = model_name, dtype, threads
        # "int8-a8": int8 weights with the activations quantised per row too (engine/quant.py, opt-in)
        if dtype == "int8-a8":
            os.environ[INT8_ACTIVATIONS_ENV] = "1"
        try:
            self.eng = Engine(EngineConfig(model=model_name, dtype=dtype.removesuffix("-a8"), device="cpu",
                                           num_threads=threads, max_num_seqs=4, enable_prefix_caching=False))
        finally:
            os.environ.pop(INT8_ACTIVATIONS_ENV, None)
        model = self.eng.model
        self.step, self.layers = Timer(self.eng, "step"), Timer(model, "_layers_one_call")
        self.lm_head = Timer(model, "greedy_tokens")
        self.prompt = [[1 + (i % 200) for i in range(16)]]
        self.params = SamplingParams(max_tokens=tokens, temperature=0, ignore_eos=True)
        self.runs: dict[str, list[dict[str, float]]] = {}

    def round(self, isa: str) -> float:
        """One timed generate under `isa` (warmed first); returns its tok/s."""
        os.environ[ck.ISA_ENV] = isa
        self.eng.generate(self.prompt, SamplingParams(max_tokens=2, temperature=0, ignore_eos=True))
        for t in (self.step, self.layers, self.lm_head):
            t.reset()
        t0 = time.perf_counter()
        res = self.eng.generate(self.prompt, self.params)
        dt = time.perf_counter() - t0
        n = len(res[0].output_token_ids) - 1
        tok_s = n / max(1e-9, dt - res[0].timings.prefill_ms / 1e3)
        self.runs.setdefault(isa, []).append({
            "tok_s": tok_s, "steps": self.step.calls, "step_s": self.step.total_s, "layers_s": self.layers.total_s,
            "layers_calls": self.layers.calls, "lm_s": self.lm_head.total_s})
        return tok_s

    def row(self, isa: str, bw: dict[str, float]) -> dict[str, Any]:
        runs = self.runs[isa]
        best = max(runs, key=lambda r: r["tok_s"])
        tok_s = statistics.median(r["tok_s"] for r in runs)
        model = self.eng.model
        wbytes = weight_bytes_per_token(model)
        achieved = wbytes * tok_s / 1e9
        steps = max(1, best["steps"])
        per_step_ms, layers_ms, lm_ms = (1e3 * best[k] / steps for k in ("step_s", "layers_s", "lm_s"))
        os.environ[ck.ISA_ENV] = isa
        return {
            "model": self.model_name, "dtype": self.dtype, "isa": ck.isa(), "kernels": ck.engine_status(self.eng),
            "backend": model.backend_name, "threads": self.threads,
            "decode_tok_s": round(tok_s, 2), "tok_s_rounds": [round(r["tok_s"], 2) for r in runs],
            "weight_mb_per_token": round(wbytes / 1e6, 2), "achieved_gb_s": round(achieved, 2),
            "share_of_triad": round(achieved / bw["triad_gb_s"], 3), "share_of_read": round(achieved / bw["read_gb_s"], 3),
            "step_ms": round(per_step_ms, 3), "layers_call_ms": round(layers_ms, 3) if self.layers.found else None,
            "lm_head_call_ms": round(lm_ms, 3) if self.lm_head.found else None,
            "python_between_ms": round(per_step_ms - layers_ms - lm_ms, 3),
            "attention_kernel_ms": round(attention_ms(model, len(self.prompt[0]) + self.params.max_tokens // 2,
                                                      self.threads), 3),
            "layers_call_calls_per_step": round(best["layers_calls"] / steps, 2),
        }


def ratios(subjects: list[Subject], isas: list[str]) -> list[dict[str, Any]]:
    """Per model and variant: each dtype's tok/s over fp32's, the median of the per-round ratios
    (rounds alternate, so a round's pair ran back to back)."""
    out = []
    by = {(s.model_name, s.dtype): s for s in subjects}
    for (name, dtype), s in by.items():
        base = by.get((name, "float32"))
        if dtype == "float32" or base is None:
            continue
        for isa in isas:
            pairs = [a["tok_s"] / b["tok_s"] for a, b in zip(s.runs[isa], base.runs[isa], strict=True)]
            out.append({"model": name, "isa": isa, "ratio": f"{dtype}/float32", "median": round(statistics.median(pairs), 3),
                        "rounds": [round(p, 3) for p in pairs]})
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=None, help="compute threads (default: the server's)")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--models", default="smollm2,dummy:small")
    ap.add_argument("--dtypes", default="float32,bfloat16,int8",
                    help="any of float32, bfloat16, int8 and int8-a8 (int8 with per-row int8 activations)")
    ap.add_argument("--isas", default=",".join(v.name for v in ck.VARIANTS if v.cpu_flags <= ck.cpu_flags()),
                    help="kernel ISA variants (default: every one this CPU runs)")
    args = ap.parse_args()
    threads = server_threads(args.threads)
    torch.set_num_threads(threads)
    isas = args.isas.split(",")
    load_before = os.getloadavg()[0]   # the conditions: a busy box reads lower on every figure
    bw = bandwidth_gb_s(args.rounds)
    print(f"bandwidth at {threads} thread(s): triad {bw['triad_gb_s']:.1f} GB/s, read {bw['read_gb_s']:.1f} GB/s")
    subjects = [Subject(name, dtype, threads, args.tokens) for name in args.models.split(",")
                for dtype in args.dtypes.split(",")]
    for _ in range(args.rounds):
        for isa in isas:
            for s in subjects:
                s.round(isa)
    rows = [s.row(isa, bw) for s in subjects for isa in isas]
    for r in rows:
        print(f"{r['model']:12} {r['dtype']:8} {r['isa']!s:10} {r['decode_tok_s']:7.1f} tok/s  "
              f"{r['weight_mb_per_token']:7.1f} MB/token  {r['achieved_gb_s']:6.2f} GB/s = "
              f"{100 * r['share_of_read']:5.1f}% of read ({100 * r['share_of_triad']:5.1f}% of triad) | step "
              f"{r['step_ms']:.2f} ms: layers call {r['layers_call_ms']} ms (attention kernel "
              f"{r['attention_kernel_ms']} ms), lm_head {r['lm_head_call_ms']} ms, Python {r['python_between_ms']} ms "
              f"[{r['backend']}]")
    rat = ratios(subjects, isas)
    for q in rat:
        print(f"{q['model']:12} {q['isa']:10} {q['ratio']:16} {q['median']:.2f}x  (rounds {q['rounds']})")
    load = (round(load_before, 2), round(os.getloadavg()[0], 2))
    print(f"load average (1 min) before / after: {load[0]} / {load[1]} on {os.cpu_count()} CPUs")
    print(json.dumps({"bench": "cpu_roofline", "threads": threads, **{k: round(v, 2) for k, v in bw.items()},
                      "load_avg_1m_before_after": load, "cpus": os.cpu_count(),
                      "cpu_flags": sorted(ck.cpu_flags() & {f for v in ck.VARIANTS for f in v.cpu_flags}),
                      "results": rows, "ratios": rat}))


if __name__ == "__main__":
    main()

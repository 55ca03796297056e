"""`--dtype int8` vs float32 on the same model, in one process, interleaved.

    .venv/bin/python bench/engine_int8.py [--model smollm2] [--tokens 64] [--rounds 3] [--threads 1] [--batch 16]

1. single-stream decode tok/s (c=1), fp32 and int8 alternating round by round (the box is shared:
   only same-run ratios mean anything);
2. batch decode tok/s (--batch concurrent greedy requests);
3. greedy agreement with fp32 over --tokens tokens on a few chat prompts: the share of positions
   equal before the first divergence, and whether the capital-of-France answer still says Paris.
Prints a table and, as its last line, one JSON object.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from zgtool.engine import Engine, EngineConfig, SamplingParams

PROMPTS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [{"role": "user", "content": "Write a haiku about the sea."}],
    [{"role": "user", "content": "Explain what a hash table is in two sentences."}],
    [{"role": "user", "content": "List three prime numbers and say why they are prime."}],
]


def decode_tok_s(eng: Engine, prompts: list[list[int]], n: int) -> float:
    params = SamplingParams(max_tokens=n, temperature=0, ignore_eos=True)
    t0 = time.perf_counter()
    res = eng.generate(prompts, params)
    dt = time.perf_counter() - t0
    prefill_s = max(r.timings.prefill_ms for r in res) / 1e3  # decode only: prefill excluded
    return sum(len(r.output_token_ids) - 1 for r in res) / max(1e-9, dt - prefill_s)


def agreement(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--batch", type=int, default=16)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    engines = {dt: Engine(EngineConfig(model=args.model, dtype=dt, device="cpu", max_num_seqs=max(4, args.batch),
                                       num_threads=args.threads, enable_prefix_caching=False))
               for dt in ("float32", "int8")}
    tok = engines["float32"].tokenizer
    chats = [tok.apply_chat_template(c) for c in PROMPTS]  # type: ignore[arg-type]
    batch = [chats[i % len(chats)] + [tok.encode(" ")[0]] * (i // len(chats)) for i in range(args.batch)]
    for e in engines.values():
        e.generate(chats[0], SamplingParams(max_tokens=4, temperature=0))  # warm-up
    c1: dict[str, list[float]] = {dt: [] for dt in engines}
    cb: dict[str, list[float]] = {dt: [] for dt in engines}
    for _ in range(args.rounds):
        for dt, e in engines.items():
            c1[dt].append(decode_tok_s(e, [chats[0]], args.tokens))
        for dt, e in engines.items():
            cb[dt].append(decode_tok_s(e, batch, max(8, args.tokens // 4)))
    greedy = SamplingParams(max_tokens=args.tokens, temperature=0)
    agree = []
    texts = {}
    for i, ids in enumerate(chats):
        ref = engines["float32"].generate(ids, greedy)
        got = engines["int8"].generate(ids, greedy)
        n = max(len(ref.output_token_ids), 1)
        agree.append(agreement(ref.output_token_ids, got.output_token_ids) / n)
        texts[i] = (ref.text, got.text)
    med = {k: {dt: statistics.median(v) for dt, v in d.items()} for k, d in (("c1", c1), (f"c{args.batch}", cb))}
    print(f"{args.model}, {args.threads} thread(s), torch {torch.__version__}, {args.rounds} interleaved rounds")
    for k, m in med.items():
        print(f"decode {k}: float32 {m['float32']:.1f} tok/s, int8 {m['int8']:.1f} tok/s -> x{m['int8'] / m['float32']:.2f}")
    for i, a in enumerate(agree):
        print(f"prompt {i}: greedy prefix agreement {a:.0%}\n  fp32: {texts[i][0][:90]!r}\n  int8: {texts[i][1][:90]!r}")
    print(json.dumps({"bench": "engine_int8", "model": args.model, "threads": args.threads, "tokens": args.tokens,
                      "decode_tok_s": med, "raw": {"c1": c1, f"c{args.batch}": cb},
                      "greedy_prefix_agreement": agree, "paris": "Paris" in texts[0][1]}))


if __name__ == "__main__":
    main()

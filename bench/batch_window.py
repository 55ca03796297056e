"""What --batch-window-ms buys under bursty arrivals.

A burst of requests arrives over a few milliseconds at an idle engine. Without a window the
first arrival starts a step at once and the rest wait for it; with a window the first step
waits (at most the window) to take the whole burst. Both engines run side by side in one
process run, alternating bursts, on the same weights.

    .venv/bin/python bench/batch_window.py [--model dummy:small] [--window-ms 3] [--bursts 6]

Prints a table and, as its last line, one JSON object with the figures and ratios.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics

from zgtool.engine import Engine, EngineConfig, SamplingParams
from zgtool.stats import percentile


async def burst(engine: Engine, size: int, spread_ms: float, prompt_len: int, out_len: int, tag: str) -> dict:
    params = SamplingParams(max_tokens=out_len, temperature=0, ignore_eos=True)
    vocab = engine.spec.vocab_size if engine.spec else 256
    steps0 = engine.num_steps
    streams = []

    async def drain(s):  # noqa: ANN001
        async for _ in s:
            pass

    tasks = []
    for i in range(size):
        prompt = [256, *[(i * 31 + j) % (vocab - 262) + 262 for j in range(prompt_len - 1)]]
        s = engine.add_request(prompt, params, request_id=f"{tag}-{i}")
        streams.append(s)
        tasks.append(asyncio.create_task(drain(s)))
        await asyncio.sleep(spread_ms / 1e3 / size)
    await asyncio.gather(*tasks)
    ttft = [s.timings.ttft_ms for s in streams]
    total = [s.timings.total_ms for s in streams]
    first = min(s.timings.arrival_s for s in streams)
    last = max(s.timings.finished_s for s in streams)
    return {"ttft_ms": ttft, "total_ms": total, "burst_ms": (last - first) * 1e3,
            "steps": engine.num_steps - steps0}


async def main_async(args: argparse.Namespace) -> dict:
    base = dict(model=args.model, max_num_seqs=64, max_num_batched_tokens=4096, enable_prefix_caching=False)
    engines = {"window 0 ms": Engine(EngineConfig(**base)),
               f"window {args.window_ms:g} ms": Engine(EngineConfig(**base, batch_window_ms=args.window_ms))}
    for e in engines.values():
        e.start()
    res: dict[str, list[dict]] = {k: [] for k in engines}
    try:
        for name, e in engines.items():  # warm-up
            await burst(e, 2, 0.5, 16, 2, f"w-{name}")
        for b in range(args.bursts):
            for name, e in engines.items():
                res[name].append(await burst(e, args.size, args.spread_ms, args.prompt, args.output, f"{b}-{name}"))
    finally:
        for e in engines.values():
            await e.shutdown(1.0)
    out = {}
    for name, runs in res.items():
        ttft = [t for r in runs for t in r["ttft_ms"]]
        out[name] = {"ttft_p50_ms": percentile(ttft, 50), "ttft_p99_ms": percentile(ttft, 99),
                     "burst_ms_p50": statistics.median(r["burst_ms"] for r in runs),
                     "steps_per_burst": statistics.median(r["steps"] for r in runs)}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="dummy:small")
    ap.add_argument("--window-ms", type=float, default=3.0)
    ap.add_argument("--bursts", type=int, default=6)
    ap.add_argument("--size", type=int, default=16, help="requests per burst")
    ap.add_argument("--spread-ms", type=float, default=2.0, help="arrivals spread over this long")
    ap.add_argument("--prompt", type=int, default=64)
    ap.add_argument("--output", type=int, default=16)
    args = ap.parse_args()
    out = asyncio.run(main_async(args))
    names = list(out)
    a, b = out[names[0]], out[names[1]]
    print(f"batch window, {args.model}: bursts of {args.size} requests over {args.spread_ms} ms, "
          f"prompt {args.prompt}, output {args.output}, {args.bursts} bursts each")
    print(f"{'engine':<16}{'TTFT p50':>12}{'TTFT p99':>12}{'burst ms':>12}{'steps':>8}")
    for n, r in out.items():
        print(f"{n:<16}{r['ttft_p50_ms']:>12.1f}{r['ttft_p99_ms']:>12.1f}{r['burst_ms_p50']:>12.1f}"
              f"{r['steps_per_burst']:>8.0f}")
    ratios = {"ttft_p50_ratio": b["ttft_p50_ms"] / a["ttft_p50_ms"], "ttft_p99_ratio": b["ttft_p99_ms"] / a["ttft_p99_ms"],
              "burst_ratio": b["burst_ms_p50"] / a["burst_ms_p50"]}
    print(f"window/no-window: TTFT p50 x{ratios['ttft_p50_ratio']:.2f}, p99 x{ratios['ttft_p99_ratio']:.2f}, "
          f"burst completion x{ratios['burst_ratio']:.2f}")
    print(json.dumps({"bench": "batch_window", "model": args.model, "window_ms": args.window_ms,
                      "results": out, **ratios}))


if __name__ == "__main__":
    main()

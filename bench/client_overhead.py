"""Benchmark: what zgtool.client adds per request over the bare official SDK (same SDK underneath).

Starts `zgtool serve --model null` on a free port, then sends interleaved requests (c=1, keep-alive)
through (a) the bare anthropic SDK raw-response API with max_retries=0 and (b) zgtool.client.Client
with an AutoFallbackPolicy, non-stream and stream. Then (issue 39 item 3) latency-split's own runner at c=8,
streaming, in alternating blocks with `--scrape` reading the engine's /metrics every 1 s (A) and without (B):
the TTFT p50 of each arm and their difference (target: at most 0.1 ms). Prints tables; the LAST line is one
JSON object.

    .venv/bin/python bench/client_overhead.py [--requests 300] [--scrape-blocks 8 --block-requests 400]
    .venv/bin/python bench/client_overhead.py --scrape-only     # the scrape A/B alone
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "support"))
from engine_live import child  # noqa: E402  (the live-engine fixture the tests use)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=300)
    ap.add_argument("--max-tokens", type=int, default=8)
    ap.add_argument("--scrape-blocks", type=int, default=8, help="blocks per arm of the scrape A/B")
    ap.add_argument("--block-requests", type=int, default=400, help="requests per block (c=8)")
    ap.add_argument("--scrape-only", action="store_true", help="only the scrape A/B")
    args = ap.parse_args()
    if args.scrape_only:
        with tempfile.TemporaryDirectory(prefix="zg-client-overhead-") as tmp, \
                child(Path(tmp), keyed=False, health_timeout_s=90) as engine:
            figures = scrape_ab(engine.url, args.scrape_blocks, args.block_requests, args.max_tokens)
        print(json.dumps({"bench": "client_overhead", **figures}))
        return

    import anthropic

    from zgtool.client import AutoFallbackPolicy, Client, FallbackConfig
    from zgtool.stats import summarize
    from zgtool.targets import Target

    with tempfile.TemporaryDirectory(prefix="zg-client-overhead-") as tmp, \
            child(Path(tmp), keyed=False, health_timeout_s=90) as engine:
        url = engine.url
        sdk = anthropic.Anthropic(base_url=url, max_retries=0, timeout=30, api_key=None,
                                  default_headers={"X-Api-Key": anthropic.omit, "Authorization": anthropic.omit})
        client = Client(Target("bench", url), policy=AutoFallbackPolicy(FallbackConfig(("default", "null"))))
        msgs = [{"role": "user", "content": "hello"}]

        def bare(stream: bool) -> None:
            if stream:
                with sdk.messages.with_streaming_response.create(model="default", max_tokens=args.max_tokens,
                                                                 messages=msgs, stream=True) as r:
                    for _ in r.parse():
                        pass
            else:
                sdk.messages.with_raw_response.create(model="default", max_tokens=args.max_tokens,
                                                      messages=msgs).parse()

        def wrapped(stream: bool) -> None:
            res = client.ask("hello", max_tokens=args.max_tokens, stream=stream)
            assert res.ok and len(res.attempts) == 1

        systems = {"sdk": bare, "zgtool.client": wrapped}
        samples: dict[tuple[str, bool], list[float]] = {(n, s): [] for n in systems for s in (False, True)}
        for stream in (False, True):
            for fn in systems.values():  # warm-up: connections, imports, first-call caches
                for _ in range(20):
                    fn(stream)
            for _ in range(args.requests):
                for name, fn in systems.items():  # interleaved, so CPU noise hits both alike
                    t0 = time.perf_counter()
                    fn(stream)
                    samples[(name, stream)].append((time.perf_counter() - t0) * 1000.0)
        sdk.close()
        client.close()
        scrape_figures = scrape_ab(url, args.scrape_blocks, args.block_requests, args.max_tokens)

    figures: dict[str, float] = {}
    print(f"{'mode':<8} {'client':<14} {'p50_ms':>8} {'p90_ms':>8} {'p99_ms':>8}")
    for stream in (False, True):
        mode = "stream" if stream else "json"
        for name in systems:
            s = summarize(samples[(name, stream)])
            print(f"{mode:<8} {name:<14} {s['p50']:8.3f} {s['p90']:8.3f} {s['p99']:8.3f}")
            key = "sdk" if name == "sdk" else "client"
            figures[f"{mode}_{key}_p50_ms"] = round(s["p50"], 3)
            figures[f"{mode}_{key}_p99_ms"] = round(s["p99"], 3)
        added = figures[f"{mode}_client_p50_ms"] - figures[f"{mode}_sdk_p50_ms"]
        figures[f"{mode}_added_p50_ms"] = round(added, 3)
        figures[f"{mode}_ratio_p50"] = round(figures[f"{mode}_client_p50_ms"] / figures[f"{mode}_sdk_p50_ms"], 3)
        print(f"{mode}: zgtool.client adds {added:.3f} ms at p50 "
              f"(x{figures[f'{mode}_ratio_p50']:.3f} of the bare SDK)")
    print(json.dumps({"bench": "client_overhead", "requests": args.requests, **figures, **scrape_figures}))


def scrape_ab(url: str, blocks: int, per_block: int, max_tokens: int) -> dict[str, float]:
    """TTFT p50 of latency-split's runner at c=8 with the /metrics scrape loop at 1 s (A) and without (B), in
    alternating blocks (A B B A A B ...), so drift and CPU noise hit both arms alike."""
    from zgtool.latency.config import SplitConfig
    from zgtool.latency.schedule.runner import measure_targets
    from zgtool.latency.schedule.scrapeloop import ScrapeLoop
    from zgtool.stats import summarize
    from zgtool.targets import Target
    from zgtool.workload.prefix_cache import metrics_url

    cfg = SplitConfig(num_requests=per_block, concurrency=8, warmup=8, stream=True, max_tokens=max_tokens, rounds=1,
                      resamples=100)
    target = Target("engine", url, api="anthropic", model="null")
    from zgtool.latency.attribution.scrape import Scraper

    scraper = Scraper(metrics_url(url))       # what one scrape costs this client: wall and CPU (the GIL it holds)
    w0, c0 = time.perf_counter(), time.thread_time()
    for _ in range(50):
        assert scraper.scrape().ok
    scrape_wall_ms, scrape_cpu_ms = (time.perf_counter() - w0) * 20.0, (time.thread_time() - c0) * 20.0
    print(f"\none scrape of {metrics_url(url)}: {scrape_wall_ms:.2f} ms wall, {scrape_cpu_ms:.2f} ms CPU of this "
          f"client (at 1 s: {scrape_cpu_ms / 10:.2f}% of the time)")
    ttft: dict[str, list[float]] = {"scrape": [], "none": []}
    block_p50: dict[str, list[float]] = {"scrape": [], "none": []}
    scrapes = 0
    for i in range(2 * blocks):
        arm = "scrape" if (i % 4) in (0, 3) else "none"
        loop = ScrapeLoop([metrics_url(url)], interval_s=1.0, t0_ns=time.perf_counter_ns()).start() \
            if arm == "scrape" else None
        try:
            (samples,) = measure_targets([target], cfg)
        finally:
            if loop is not None:
                loop.stop()
                scrapes += loop.sources[0].scrapes - 1        # less the one at stop
        got = [s.ttft_ms for s in samples if s.ok and s.ttft_ms is not None]
        ttft[arm] += got
        block_p50[arm].append(summarize(got)["p50"])
    p50 = {arm: summarize(v)["p50"] for arm, v in ttft.items()}
    diff = p50["scrape"] - p50["none"]
    print(f"\nlatency-split runner, c=8, stream, {blocks} blocks x {per_block} requests per arm, alternating")
    print(f"{'arm':<16} {'n':>6} {'ttft_p50_ms':>12}")
    for arm, label in (("none", "no scrape"), ("scrape", "scrape at 1 s")):
        print(f"{label:<16} {len(ttft[arm]):>6} {p50[arm]:12.3f}")
    import statistics

    # the noise floor: how far one block's p50 strays from its arm's, over sqrt(blocks) (standard error)
    se = (statistics.stdev(block_p50["scrape"]) ** 2 / blocks + statistics.stdev(block_p50["none"]) ** 2 / blocks) ** 0.5 \
        if blocks > 1 else float("nan")
    print(f"block p50s, no scrape: {' '.join(f'{v:.2f}' for v in block_p50['none'])}")
    print(f"block p50s, scrape:    {' '.join(f'{v:.2f}' for v in block_p50['scrape'])}")
    print(f"standard error of the difference from the blocks' spread: {se:.3f} ms (this run resolves no finer)")
    print(f"scrape at 1 s moves TTFT p50 by {diff:+.3f} ms (x{p50['scrape'] / p50['none']:.3f}; target |diff| "
          f"<= 0.1 ms; {scrapes} scrapes during the A blocks)")
    return {"scrape_ttft_p50_ms": round(p50["scrape"], 3), "noscrape_ttft_p50_ms": round(p50["none"], 3),
            "scrape_ttft_p50_diff_ms": round(diff, 3), "scrape_ratio_p50": round(p50["scrape"] / p50["none"], 4),
            "scrape_diff_se_ms": round(se, 3), "scrape_wall_ms": round(scrape_wall_ms, 3),
            "scrape_cpu_ms": round(scrape_cpu_ms, 3), "scrapes": scrapes, "scrape_requests_per_arm": len(ttft["scrape"])}


if __name__ == "__main__":
    main()

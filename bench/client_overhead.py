"""Benchmark: what zgtool.client adds per request over the bare official SDK (same SDK underneath).

Starts `zgtool serve --model null` on a free port, then sends interleaved requests (c=1, keep-alive)
through (a) the bare anthropic SDK raw-response API with max_retries=0 and (b) zgtool.client.Client
with an AutoFallbackPolicy, non-stream and stream. Prints a table; the LAST line is one JSON object.

    .venv/bin/python bench/client_overhead.py [--requests 300]
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
    args = ap.parse_args()

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
    print(json.dumps({"bench": "client_overhead", "requests": args.requests, **figures}))


if __name__ == "__main__":
    main()

"""Issue 37's three isolation checks, run by bench/isolation.py --checks (measurement only; the
printing is isolation.py's):

- tenancy: a free key's TTFT beside a pro key holding 32 streams, on the engine's own port and
  through `serve --gateway stack --keys`, side by side on one stack (goal: stack within 2x of direct);
- silence: the longest time 32 streams on `--kv-memory-mb 1` go without a byte (queued, preempted),
  against the keepalive interval (goal: at most the interval + 1 s);
- freeze: a victim stream's time and /health's latency beside four 7 MB prompts sent together vs
  alone, rounds alternated (goal: /health under 100 ms, victim within 1.5x of alone); and beside
  the four resent as soon as answered for the victim's whole run (a flood: every 7 MB body is
  received by the server, ~15 ms of its CPU, and decoded by its body worker process at nice 10,
  20-80 ms there: engine/server/body_worker.py). On a shared box /health's tail is mostly the
  OS scheduler: compare beside with alone in the same run, over several runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import statistics
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx

from zgtool.gateway.supervisor import LocalStack, StackConfig

FREE_KEY = "sk-iso-free"
PRO_KEY = "sk-iso-pro"
TIER_KEYS = f"""
[tiers.free]
max_concurrent = 4
[tiers.pro]
max_concurrent = 64
[[keys]]
name = "free"
tier = "free"
key = "{FREE_KEY}"
[[keys]]
name = "pro"
tier = "pro"
key = "{PRO_KEY}"
"""


# GET /health every 20 ms until stdin closes; then each latency (ms), one a line
HEALTH_PROBE = """
import select, sys, time, httpx
lat = []
with httpx.Client(timeout=60) as c:
    while not select.select([sys.stdin], [], [], 0.02)[0]:
        t = time.perf_counter()
        c.get(sys.argv[1] + "/health")
        lat.append((time.perf_counter() - t) * 1e3)
print("\\n".join(f"{x:.3f}" for x in lat))
"""


def _messages(model: str, text: str, max_tokens: int, **extra: Any) -> dict[str, Any]:
    return {"model": model, "max_tokens": max_tokens, "stream": True, "temperature": 0,
            "messages": [{"role": "user", "content": text}], **extra}


async def _stream(client: httpx.AsyncClient, url: str, body: dict[str, Any], key: str | None,
                  gaps: list[float] | None = None, first: list[float] | None = None) -> tuple[float | None, float, int]:
    """(TTFT s, total s, status) of one Anthropic stream; ``gaps`` gets every silence between reads,
    ``first`` the TTFT as soon as it is seen."""
    headers = {"x-api-key": key} if key else {}
    t0 = time.perf_counter()
    ttft = None
    last = t0
    async with client.stream("POST", url + "/v1/messages", json=body, headers=headers) as r:
        async for chunk in r.aiter_raw():
            now = time.perf_counter()
            if gaps is not None:
                gaps.append(now - last)
            last = now
            if ttft is None and b"content_block_delta" in chunk:
                ttft = now - t0
                if first is not None:
                    first.append(ttft)
        status = r.status_code
    return ttft, time.perf_counter() - t0, status


@contextlib.contextmanager
def _stack(model: str, run_dir: Path, engine_args: tuple[str, ...], keyed: bool) -> Iterator[LocalStack]:
    run_dir.mkdir(parents=True, exist_ok=True)
    keys = None
    if keyed:
        keys = run_dir / "keys.toml"
        keys.write_text(TIER_KEYS)
    cfg = StackConfig(model=model, paths=("stack",) if keyed else (), pygw_keys=keys, pygw_policy="none",
                      engine_args=engine_args, run_dir=run_dir)
    with LocalStack(cfg) as st:
        yield st


async def _free_beside_pro(url: str, model: str, probes: int) -> list[float]:
    """TTFTs (s) of ``probes`` free-key streams, one after another, while 32 pro streams run."""
    limits = httpx.Limits(max_connections=64)
    async with httpx.AsyncClient(timeout=httpx.Timeout(600.0), limits=limits) as client:
        pro_first: list[float] = []

        async def pro(i: int) -> None:     # ~130 prompt tokens + 880 on a 1,024-token model
            body = _messages(model, f"pro stream {i} " + "hello " * 20, 880, ignore_eos=True)
            with contextlib.suppress(httpx.HTTPError, asyncio.CancelledError):
                await _stream(client, url, body, PRO_KEY, first=pro_first)

        hogs = [asyncio.create_task(pro(i)) for i in range(32)]
        deadline = time.monotonic() + 120
        while len(pro_first) < 32 and time.monotonic() < deadline and not all(h.done() for h in hogs):
            await asyncio.sleep(0.05)
        ttfts = []
        running = sum(not h.done() for h in hogs)
        for i in range(probes):
            ttft, _, status = await _stream(client, url, _messages(model, f"free probe {i}", 4), FREE_KEY)
            ttfts.append(ttft if status == 200 and ttft is not None else float("nan"))
        still = sum(not h.done() for h in hogs)
        for h in hogs:
            h.cancel()
        await asyncio.gather(*hogs, return_exceptions=True)
    if min(running, still) < 32:
        print(f"  (only {min(running, still)} of 32 pro streams ran through the probes)", flush=True)
    return ttfts


def tenancy(model: str, run_dir: Path, probes: int = 5) -> dict[str, Any]:
    out: dict[str, Any] = {}
    with _stack(model, run_dir, (), keyed=True) as st:
        for front in ("direct", "stack", "direct", "stack"):         # alternated
            ttfts = asyncio.run(_free_beside_pro(st.urls[front], model, probes))
            out.setdefault(front, []).extend(ttfts)
    row = {f"{front}_ttft_ms": {"median": round(statistics.median(v) * 1e3, 1), "max": round(max(v) * 1e3, 1)}
           for front, v in out.items()}
    row["stack_over_direct_median"] = round(statistics.median(out["stack"]) / statistics.median(out["direct"]), 2)
    return row


async def _longest_silences(url: str, model: str, n: int) -> tuple[list[float], list[int]]:
    limits = httpx.Limits(max_connections=n + 4)
    async with httpx.AsyncClient(timeout=httpx.Timeout(900.0), limits=limits) as client:
        gaps: list[list[float]] = [[] for _ in range(n)]
        # ~100 prompt + 900 output tokens on dummy:tiny: a quarter of the 1 MB pool each
        results = await asyncio.gather(*(
            _stream(client, url, _messages(model, f"{i} " + "hello " * 16, 900, ignore_eos=True), None, gaps[i])
            for i in range(n)))
    return [max(g) if g else float("nan") for g in gaps], [r[2] for r in results]


def silence(model: str, run_dir: Path, keepalive_s: float = 1.0, n: int = 32) -> dict[str, Any]:
    """With keepalives every ``keepalive_s``, and (for comparison) with them off in effect. 1 s, not
    the 3 s default: dummy:tiny's waits on this pool are a few seconds, so 3 s would hardly show."""
    out: dict[str, Any] = {"streams": n, "keepalive_s": keepalive_s, "goal_s": keepalive_s + 1.0}
    for name, every_s in (("keepalive", keepalive_s), ("no_keepalive", 1e9)):
        args = ("--kv-memory-mb", "1", "--stream-keepalive-s", str(every_s))
        with _stack(model, run_dir / name, args, keyed=False) as st:
            longest, statuses = asyncio.run(_longest_silences(st.urls["direct"], model, n))
        out[name] = {"longest_silence_s": round(max(longest), 3),
                     "median_longest_silence_s": round(statistics.median(longest), 3),
                     "statuses": {str(s): statuses.count(s) for s in set(statuses)}}
    return out


async def _victim_round(url: str, model: str, hostile: int, hostile_bytes: int,
                        flood: bool) -> tuple[float, list[float], int]:
    """(victim stream s, /health latencies ms, hostile requests answered) for one round: ``hostile``
    prompts of ``hostile_bytes`` sent together as the victim starts (``flood``: each resent as soon
    as it is answered, for as long as the victim runs)."""
    big = json.dumps(_messages(model, "x" * hostile_bytes, 16) | {"stream": False}).encode()
    async with httpx.AsyncClient(timeout=httpx.Timeout(600.0), limits=httpx.Limits(max_connections=16)) as client:
        done = asyncio.Event()
        answered = 0

        async def hog() -> None:
            nonlocal answered
            while True:
                r = await client.post(url + "/v1/messages", content=big, headers={"content-type": "application/json"})
                answered += r.status_code < 500
                if not flood or done.is_set():
                    return

        # /health is probed from a process of its own: this one's loop is busy sending 28 MB
        probes = await asyncio.create_subprocess_exec(sys.executable, "-c", HEALTH_PROBE, url,
                                                      stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE)
        await asyncio.sleep(0.3)       # its first probes are in
        victim = asyncio.create_task(_stream(client, url, _messages(model, "Write a short poem about the sea.", 64,
                                                                    ignore_eos=True), None))
        hogs = [asyncio.create_task(hog()) for _ in range(hostile)]
        _, total, _ = await victim
        done.set()
        await asyncio.gather(*hogs, return_exceptions=True)
        out, _ = await probes.communicate(b"")    # EOF on its stdin: it stops and prints each latency
        health = [float(x) for x in out.split()]
    return total, health, answered


def _health(runs: list[tuple[float, list[float], int]]) -> dict[str, float]:
    lat = sorted(x for r in runs for x in r[1])
    return {"p50": round(lat[len(lat) // 2], 1), "p99": round(lat[int(len(lat) * 0.99)], 1),
            "max": round(lat[-1], 1), "n": len(lat)}


def freeze(model: str, run_dir: Path, rounds: int = 2, hostile_bytes: int = 7_000_000) -> dict[str, Any]:
    runs: dict[str, list[tuple[float, list[float], int]]] = {"alone": [], "beside": [], "flood": []}
    with _stack(model, run_dir, (), keyed=False) as st:
        url = st.urls["direct"]
        asyncio.run(_victim_round(url, model, 0, hostile_bytes, False))          # warm-up, dropped
        for _ in range(rounds):                                                  # alternated
            runs["alone"].append(asyncio.run(_victim_round(url, model, 0, hostile_bytes, False)))
            runs["beside"].append(asyncio.run(_victim_round(url, model, 4, hostile_bytes, False)))
            runs["flood"].append(asyncio.run(_victim_round(url, model, 4, hostile_bytes, True)))
    alone = statistics.median(a[0] for a in runs["alone"])
    out: dict[str, Any] = {"hostile": 4, "hostile_bytes": hostile_bytes, "rounds": rounds,
                           "victim_alone_s": round(alone, 3),
                           "health_ms_alone": _health(runs["alone"])}
    for name in ("beside", "flood"):
        victim = statistics.median(r[0] for r in runs[name])
        out[name] = {"victim_s": round(victim, 3), "victim_ratio": round(victim / alone, 2),
                     "health_ms": _health(runs[name]),
                     "hostile_answered": sum(r[2] for r in runs[name])}
    return out

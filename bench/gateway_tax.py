"""What each gateway hop costs: direct vs nginx (streaming) vs pygw vs nginx -> pygw,
against the same engine, in one run, for `--model null` (pure serving overhead) and
`dummy:small` (real model time on this machine).

    .venv/bin/python bench/gateway_tax.py [--models null,dummy:small] [--seconds 3]

Paths are measured in interleaved slices so drifting background load hits each alike.
Closed-loop load from a minimal keep-alive HTTP/1.1 client (asyncio + uvloop, one
connection per worker) so the client adds as little as possible; non-streaming
POST /v1/messages at temperature 1 (pygw's cache never answers). Prints a table per
cell, the added milliseconds per hop with its share of end-to-end time, and as the
LAST line one JSON object with every figure.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from dataclasses import asdict, dataclass
from urllib.parse import urlsplit

from zgtool.gateway.supervisor import LocalStack, StackConfig
from zgtool.stats import percentile

PATHS = ("direct", "nginx", "pygw", "stack")
# (hop name, path with the hop, path without it)
HOPS = (("nginx", "nginx", "direct"), ("pygw", "pygw", "direct"), ("nginx+pygw", "stack", "direct"),
        ("nginx in front of pygw", "stack", "pygw"))


@dataclass(frozen=True)
class Cell:
    model: str
    path: str
    concurrency: int
    requests: int
    errors: int
    p50_ms: float
    p99_ms: float
    rate_rps: float


@dataclass(frozen=True)
class Hop:
    model: str
    concurrency: int
    hop: str
    added_p50_ms: float
    added_p99_ms: float
    share_of_e2e_p50: float  # added p50 / p50 of the path that includes the hop
    rps_ratio: float         # throughput with the hop / without it


def _request_bytes(url: str, max_tokens: int) -> tuple[str, int, bytes]:
    u = urlsplit(url)
    body = json.dumps({"model": "default", "max_tokens": max_tokens, "temperature": 1.0,
                       "messages": [{"role": "user", "content": "Say something about gateways."}]}).encode()
    head = (f"POST /v1/messages HTTP/1.1\r\nHost: {u.hostname}:{u.port}\r\nx-api-key: bench\r\n"
            f"anthropic-version: 2023-06-01\r\ncontent-type: application/json\r\n"
            f"content-length: {len(body)}\r\n\r\n").encode()
    return u.hostname or "127.0.0.1", int(u.port or 80), head + body


async def _read_response(reader: asyncio.StreamReader) -> int:
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {k.strip().lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:] if ln)}
    if "content-length" in headers:
        await reader.readexactly(int(headers["content-length"]))
    elif headers.get("transfer-encoding", "").lower() == "chunked":
        while True:
            size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
            await reader.readexactly(size + 2)
            if size == 0:
                break
    return status


async def _load(url: str, concurrency: int, seconds: float, max_tokens: int) -> tuple[list[float], int, float]:
    host, port, raw = _request_bytes(url, max_tokens)
    lat_ms: list[float] = []
    errors = 0
    stop_at = time.perf_counter() + seconds

    async def worker() -> None:
        nonlocal errors
        reader, writer = await asyncio.open_connection(host, port)
        try:
            while time.perf_counter() < stop_at:
                t0 = time.perf_counter()
                writer.write(raw)
                status = await _read_response(reader)
                if status == 200:
                    lat_ms.append((time.perf_counter() - t0) * 1e3)
                else:
                    errors += 1
        finally:
            writer.close()

    t0 = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return lat_ms, errors, time.perf_counter() - t0


def run_model(model: str, concurrencies: list[int], seconds: float, max_tokens: int, slice_s: float) -> list[Cell]:
    """Paths are measured in interleaved slices (direct, nginx, pygw, stack, direct, ...)
    so that load from elsewhere on a shared machine drifts onto every path alike."""
    cells: list[Cell] = []
    cfg = StackConfig(model=model, paths=("nginx", "pygw", "stack"), nginx_mode="streaming", pygw_policy="default")
    with LocalStack(cfg) as st:
        for path in PATHS:
            asyncio.run(_load(st.urls[path], 4, min(1.0, seconds / 3), max_tokens))  # warm pools and caches
        for c in concurrencies:
            lat: dict[str, list[float]] = {p: [] for p in PATHS}
            errs = dict.fromkeys(PATHS, 0)
            wall = dict.fromkeys(PATHS, 0.0)
            rounds = max(1, round(seconds / slice_s))
            for r in range(rounds):
                order = PATHS[r % len(PATHS):] + PATHS[: r % len(PATHS)]
                for path in order:
                    got, e, w = asyncio.run(_load(st.urls[path], c, slice_s, max_tokens))
                    lat[path] += got
                    errs[path] += e
                    wall[path] += w
            for path in PATHS:
                xs = lat[path]
                cells.append(Cell(model, path, c, len(xs), errs[path], percentile(xs, 50), percentile(xs, 99),
                                  len(xs) / wall[path]))
                print(f"  {model:<12} {path:<7} c={c:<3} n={len(xs):<6} p50={cells[-1].p50_ms:8.2f} ms "
                      f"p99={cells[-1].p99_ms:8.2f} ms {cells[-1].rate_rps:8.1f} req/s", file=sys.stderr)
    return cells


def hops(cells: list[Cell]) -> list[Hop]:
    by = {(c.model, c.path, c.concurrency): c for c in cells}
    out = []
    for model, conc in sorted({(c.model, c.concurrency) for c in cells}):
        for name, with_hop, without in HOPS:
            a, b = by[(model, with_hop, conc)], by[(model, without, conc)]
            added = a.p50_ms - b.p50_ms
            out.append(Hop(model, conc, name, added, a.p99_ms - b.p99_ms,
                           added / a.p50_ms if a.p50_ms else float("nan"),
                           a.rate_rps / b.rate_rps if b.rate_rps else float("nan")))
    return out


def render(cells: list[Cell], hop_rows: list[Hop]) -> str:
    lines = [f"{'model':<12} {'path':<7} {'conc':>4} {'n':>6} {'err':>4} {'p50 ms':>9} {'p99 ms':>9} {'req/s':>9}"]
    lines += [f"{c.model:<12} {c.path:<7} {c.concurrency:>4} {c.requests:>6} {c.errors:>4} {c.p50_ms:>9.2f} "
              f"{c.p99_ms:>9.2f} {c.rate_rps:>9.1f}" for c in cells]
    lines += ["", f"{'model':<12} {'conc':>4} {'hop':<24} {'+p50 ms':>9} {'+p99 ms':>9} {'share e2e':>10} {'rps x':>7}"]
    lines += [f"{h.model:<12} {h.concurrency:>4} {h.hop:<24} {h.added_p50_ms:>9.2f} {h.added_p99_ms:>9.2f} "
              f"{h.share_of_e2e_p50:>9.1%} {h.rps_ratio:>7.2f}" for h in hop_rows]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default="null,dummy:small")
    ap.add_argument("--concurrency", default="1,16")
    ap.add_argument("--seconds", type=float, default=3.0, help="per cell for null; doubled for model-bound runs")
    ap.add_argument("--max-tokens", type=int, default=16, help="per request for null (dummy models use 4)")
    ap.add_argument("--slice", type=float, default=0.5, help="seconds per interleaved slice (doubled for models)")
    args = ap.parse_args()
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    concurrencies = [int(x) for x in args.concurrency.split(",")]
    cells: list[Cell] = []
    for model in args.models.split(","):
        model_bound = model != "null"
        scale = 2 if model_bound else 1
        cells += run_model(model, concurrencies, args.seconds * scale, 4 if model_bound else args.max_tokens,
                           args.slice * scale)
    hop_rows = hops(cells)
    print(render(cells, hop_rows))
    summary = {"bench": "gateway_tax", "cells": [asdict(c) for c in cells], "hops": [asdict(h) for h in hop_rows]}
    print(json.dumps(summary))


if __name__ == "__main__":
    main()

"""What each gateway costs, side by side: the engine direct vs every gateway kind zgtool runs
(nginx, HAProxy, Caddy, Varnish, Squid, pygw, the LiteLLM proxy) in front of the same engine,
for `--model null` (pure serving overhead) and the real model (`smollm2`, falling back to
`dummy:small` when it cannot be loaded), each at concurrency 1 and 16.

    .venv/bin/python bench/gateway_tax.py [--models null,smollm2] [--kinds nginx,haproxy,...]
                                          [--seconds 3] [--slice 0.5] [--concurrency 1,16]

Load: closed loop from a minimal keep-alive HTTP/1.1 client (asyncio + uvloop, one connection
per worker), non-streaming POST /v1/chat/completions (what LiteLLM users send), temperature 1.
Paths are measured in interleaved slices (direct, nginx, haproxy, ..., direct, ...) so that
background load drifts onto every path alike.

Per gateway and cell:
- added ms: p50(gateway) - p50(direct), with a 95% interval from a bootstrap that resamples
  whole rounds of slices (requests in one round share machine state; resampling them one by
  one would make the interval too narrow);
- % of e2e: added p50 / the gateway path's p50;
- gateway CPU ms per request: utime+stime of every process in the gateway's process group
  (/proc/PID/stat, before and after each slice) / requests it answered; the engine's own
  figure is in the direct row for scale;
- where it goes: the gateway's own timing where it reports one, Server-Timing `gw_*`
  metrics (pygw) and LiteLLM's `x-litellm-overhead-duration-ms` (medians).
Prints a table, and as the LAST line one JSON object with every figure.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import re
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field
from urllib.parse import urlsplit

from zgtool.gateway.kinds import GATEWAY_KINDS
from zgtool.gateway.supervisor import LocalStack, StackConfig, StartFailed
from zgtool.stats import percentile

DEFAULT_KINDS = "nginx,haproxy,caddy,varnish,squid,pygw,litellm"
_TICK_S = 1.0 / os.sysconf("SC_CLK_TCK")
_ST_METRIC = re.compile(r"\s*([\w.-]+)\s*(?:;[^,]*?dur=([\d.]+))?[^,]*")


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
    cpu_ms_per_req: float                         # the path's own processes (engine for direct)
    where_ms: dict[str, float] = field(default_factory=dict)  # gateway-reported parts (medians)
    error_statuses: dict[str, int] = field(default_factory=dict)  # status -> count of non-200 answers


@dataclass(frozen=True)
class Tax:
    model: str
    concurrency: int
    gateway: str
    added_p50_ms: float
    ci95_ms: tuple[float, float]
    share_of_e2e: float
    gateway_cpu_ms_per_req: float
    where_ms: dict[str, float]


@dataclass
class Samples:
    rounds: list[list[float]] = field(default_factory=list)  # latencies (ms) per interleaving round
    errors: int = 0
    error_statuses: dict[str, int] = field(default_factory=dict)
    wall_s: float = 0.0
    cpu_s: float = 0.0
    where: dict[str, list[float]] = field(default_factory=dict)

    @property
    def all(self) -> list[float]:
        return [x for r in self.rounds for x in r]


def _request_bytes(url: str, max_tokens: int, model_id: str) -> tuple[str, int, bytes]:
    u = urlsplit(url)
    body = json.dumps({"model": model_id, "max_tokens": max_tokens, "temperature": 1.0,
                       "messages": [{"role": "user", "content": "Say something about gateways."}]}).encode()
    head = (f"POST /v1/chat/completions HTTP/1.1\r\nHost: {u.hostname}:{u.port}\r\n"
            f"authorization: Bearer sk-bench\r\ncontent-type: application/json\r\n"
            f"content-length: {len(body)}\r\n\r\n").encode()
    return u.hostname or "127.0.0.1", int(u.port or 80), head + body


async def _read_response(reader: asyncio.StreamReader) -> tuple[int, dict[str, str]]:
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers: dict[str, str] = {}
    for k, _, v in (ln.partition(":") for ln in lines[1:] if ln):
        key = k.strip().lower()
        headers[key] = f"{headers[key]}, {v.strip()}" if key in headers else v.strip()
    if "content-length" in headers:
        await reader.readexactly(int(headers["content-length"]))
    elif headers.get("transfer-encoding", "").lower() == "chunked":
        while True:
            size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
            await reader.readexactly(size + 2)
            if size == 0:
                break
    return status, headers


def _where(headers: dict[str, str]) -> dict[str, float]:
    """The gateway's own account of its time: Server-Timing gw_* metrics, LiteLLM's overhead."""
    out: dict[str, float] = {}
    for m in _ST_METRIC.finditer(headers.get("server-timing", "")):
        if m.group(1).startswith("gw_") and m.group(2):
            out[m.group(1)] = float(m.group(2))
    if "x-litellm-overhead-duration-ms" in headers:
        out["litellm_overhead"] = float(headers["x-litellm-overhead-duration-ms"])
    return out


async def _load(url: str, concurrency: int, seconds: float, max_tokens: int,
                model_id: str) -> tuple[list[float], dict[str, int], float, list]:
    host, port, raw = _request_bytes(url, max_tokens, model_id)
    lat_ms: list[float] = []
    wheres: list[dict[str, float]] = []
    errors: dict[str, int] = {}
    stop_at = time.perf_counter() + seconds

    async def worker() -> None:
        while time.perf_counter() < stop_at:
            reader, writer = await asyncio.open_connection(host, port)
            try:
                while time.perf_counter() < stop_at:
                    t0 = time.perf_counter()
                    writer.write(raw)
                    status, headers = await _read_response(reader)
                    if status == 200:
                        lat_ms.append((time.perf_counter() - t0) * 1e3)
                        wheres.append(_where(headers))
                    else:
                        errors[str(status)] = errors.get(str(status), 0) + 1
                    if headers.get("connection", "").lower() == "close":
                        break
            except (asyncio.IncompleteReadError, ConnectionError) as exc:  # counted; a new connection goes on
                errors[type(exc).__name__] = errors.get(type(exc).__name__, 0) + 1
            finally:
                writer.close()

    t0 = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return lat_ms, errors, time.perf_counter() - t0, wheres


def group_cpu_s(pgid: int) -> float:
    """utime+stime (s) of every live process in a process group (the gateway and its workers)."""
    total = 0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            fields = open(f"/proc/{entry}/stat").read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid:  # fields after "pid (comm)": state ppid pgrp ... utime(11) stime(12)
            total += int(fields[11]) + int(fields[12])
    return total * _TICK_S


def block_bootstrap_ci(a: list[list[float]], b: list[list[float]], n: int = 400, seed: int = 1) -> tuple[float, float]:
    """95% interval of p50(a) - p50(b), resampling whole rounds (a[i] and b[i] together)."""
    rng = random.Random(seed)
    k = len(a)
    diffs = []
    for _ in range(n):
        idx = [rng.randrange(k) for _ in range(k)]
        xa = [x for i in idx for x in a[i]]
        xb = [x for i in idx for x in b[i]]
        if xa and xb:
            diffs.append(statistics.median(xa) - statistics.median(xb))
    diffs.sort()
    if not diffs:
        return float("nan"), float("nan")
    return diffs[int(0.025 * (len(diffs) - 1))], diffs[int(0.975 * (len(diffs) - 1))]


def _start(model: str, kinds: list[str]) -> LocalStack:
    st = LocalStack(StackConfig(model=model, paths=tuple(kinds), nginx_mode="streaming", pygw_policy="default"))
    st.__enter__()
    return st


def run_model(model: str, kinds: list[str], concurrencies: list[int], seconds: float, max_tokens: int,
              slice_s: float) -> tuple[list[Cell], list[Tax]]:
    paths = ["direct", *kinds]
    st = _start(model, kinds)
    try:
        pgid = {c.name: c.pid for c in st.children if c.pid is not None}  # each child leads its group
        pgid["direct"] = pgid["engine"]
        import httpx

        model_id = httpx.get(st.urls["direct"] + "/v1/models").json()["data"][0]["id"]  # the name it serves
        for path in paths:
            asyncio.run(_load(st.urls[path], 4, 0.5, max_tokens, model_id))  # warm pools, caches, JITs
        cells: list[Cell] = []
        taxes: list[Tax] = []
        for c in concurrencies:
            s = {p: Samples() for p in paths}
            rounds = max(2, round(seconds / slice_s))
            for r in range(rounds):
                order = paths[r % len(paths):] + paths[: r % len(paths)]
                for path in order:
                    cpu0 = group_cpu_s(pgid[path])
                    got, errs, wall, wheres = asyncio.run(_load(st.urls[path], c, slice_s, max_tokens, model_id))
                    s[path].cpu_s += group_cpu_s(pgid[path]) - cpu0
                    s[path].rounds.append(got)
                    s[path].errors += sum(errs.values())
                    for status, count in errs.items():
                        s[path].error_statuses[status] = s[path].error_statuses.get(status, 0) + count
                    s[path].wall_s += wall
                    for w in wheres:
                        for name, v in w.items():
                            s[path].where.setdefault(name, []).append(v)
            for path in paths:
                xs = s[path].all
                n = len(xs)
                cell = Cell(model, path, c, n, s[path].errors, percentile(xs, 50) if xs else float("nan"),
                            percentile(xs, 99) if xs else float("nan"), n / s[path].wall_s,
                            s[path].cpu_s * 1e3 / n if n else float("nan"),
                            {k: statistics.median(v) for k, v in s[path].where.items()}, s[path].error_statuses)
                cells.append(cell)
                print(f"  {model:<12} {path:<8} c={c:<3} n={n:<6} err={cell.errors:<3} p50={cell.p50_ms:8.2f} ms "
                      f"cpu={cell.cpu_ms_per_req:6.2f} ms/req", file=sys.stderr)
            direct = next(x for x in cells if x.path == "direct" and x.concurrency == c)
            for path in kinds:
                cell = next(x for x in cells if x.path == path and x.concurrency == c)
                added = cell.p50_ms - direct.p50_ms
                taxes.append(Tax(model, c, path, added, block_bootstrap_ci(s[path].rounds, s["direct"].rounds),
                                 added / cell.p50_ms if cell.p50_ms else float("nan"), cell.cpu_ms_per_req,
                                 cell.where_ms))
        return cells, taxes
    finally:
        st.__exit__(None, None, None)


def render(cells: list[Cell], taxes: list[Tax]) -> str:
    lines = [f"{'model':<12} {'path':<8} {'conc':>4} {'n':>6} {'err':>4} {'p50 ms':>9} {'p99 ms':>9} "
             f"{'req/s':>8} {'cpu ms/req':>10}"]
    lines += [f"{c.model:<12} {c.path:<8} {c.concurrency:>4} {c.requests:>6} {c.errors:>4} {c.p50_ms:>9.2f} "
              f"{c.p99_ms:>9.2f} {c.rate_rps:>8.1f} {c.cpu_ms_per_req:>10.2f}" for c in cells]
    lines += [f"  errors on {c.path} c={c.concurrency} ({c.model}): "
              + ", ".join(f"{n} x HTTP {st}" for st, n in sorted(c.error_statuses.items()))
              for c in cells if c.error_statuses]
    lines += ["", "gateway tax (p50 added over direct, 95% interval from a round-resampling bootstrap)",
              f"{'model':<12} {'conc':>4} {'gateway':<8} {'+p50 ms':>9} {'95% interval':>20} {'% e2e':>7} "
              f"{'gw cpu ms/req':>13}  where (gateway's own timing, ms p50)"]
    for t in taxes:
        where = ", ".join(f"{k}={v:.2f}" for k, v in sorted(t.where_ms.items())) or "-"
        ci = f"[{t.ci95_ms[0]:+.2f}, {t.ci95_ms[1]:+.2f}]"
        lines.append(f"{t.model:<12} {t.concurrency:>4} {t.gateway:<8} {t.added_p50_ms:>+9.2f} {ci:>20} "
                     f"{t.share_of_e2e:>7.1%} {t.gateway_cpu_ms_per_req:>13.2f}  {where}")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    ap.add_argument("--models", default="null,smollm2", help="the real model falls back to dummy:small")
    ap.add_argument("--kinds", default=DEFAULT_KINDS, help=f"gateways to measure, from {','.join(GATEWAY_KINDS)}")
    ap.add_argument("--concurrency", default="1,16")
    ap.add_argument("--seconds", type=float, default=3.0, help="per path and cell for null; doubled for models")
    ap.add_argument("--max-tokens", type=int, default=16, help="per request for null (models use 4)")
    ap.add_argument("--slice", type=float, default=0.5, help="seconds per interleaved slice (doubled for models)")
    args = ap.parse_args()
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    kinds = [k for k in args.kinds.split(",") if k]
    bad = [k for k in kinds if k not in GATEWAY_KINDS]
    if bad:
        raise SystemExit(f"unknown gateway kind {bad[0]!r}; choose from {', '.join(GATEWAY_KINDS)}")
    concurrencies = [int(x) for x in args.concurrency.split(",")]
    cells: list[Cell] = []
    taxes: list[Tax] = []
    notes: list[str] = []
    for model in args.models.split(","):
        bound = model != "null"
        scale = 2 if bound else 1
        run = (concurrencies, args.seconds * scale, 4 if bound else args.max_tokens, args.slice * scale)
        try:
            c, t = run_model(model, kinds, *run)
        except StartFailed as exc:
            if model != "smollm2":
                raise
            notes.append(f"smollm2 did not start ({exc.message.splitlines()[0][:160]}); measured dummy:small")
            print(f"  {notes[-1]}", file=sys.stderr)
            c, t = run_model("dummy:small", kinds, *run)
        cells += c
        taxes += t
    print(render(cells, taxes))
    for n in notes:
        print(f"note: {n}")
    summary = {"bench": "gateway_tax", "kinds": kinds, "notes": notes, "cells": [asdict(c) for c in cells],
               "tax": [asdict(t) for t in taxes]}
    print(json.dumps(summary))


if __name__ == "__main__":
    main()

"""What latency-split's own client costs per request, and the per-path figures for the closing note.

1. Overhead: the instrumented client (httpx + httpcore trace + stream marks + SSE parsing, as
   `zgtool latency-split` runs it) against a bare keep-alive socket loop (pre-built request
   bytes, read to the end of the body, nothing else), both against the same `--model null`
   engine, strictly alternating so background load and server state hit both alike. Target: the difference
   of medians under 5% of a null-model request's latency.
2. Paths: direct vs nginx vs pygw vs nginx -> pygw ("stack") on `dummy:small`, measured by
   latency-split itself, with the per-phase gateway tax and its bootstrap interval.

    .venv/bin/python bench/measurement_overhead.py [--requests 400] [--split-requests 24] [--skip-dummy]

Prints readable tables and, as the LAST line, one JSON object with every figure.
"""

from __future__ import annotations

import argparse
import json
import socket
import sys
from time import perf_counter_ns
from typing import Any

from zgtool.bootstrap import median_difference
from zgtool.gateway.supervisor import LocalStack, StackConfig
from zgtool.latency.analysis.phases import analyse, phase
from zgtool.latency.config import SplitConfig
from zgtool.latency.schedule.runner import measure_targets
from zgtool.latency.wire.client import Endpoint, Session
from zgtool.stats import summarize
from zgtool.targets import Target

TARGET_RATIO = 0.05


class BareClient:
    """The least a client can do: one keep-alive socket, fixed request bytes, read to the end."""

    def __init__(self, ep: Endpoint) -> None:
        self.sock = socket.create_connection((ep.host, ep.port))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        head = "".join(f"{k}: {v}\r\n" for k, v in ep.headers.items())
        self.request = (f"POST {ep.path} HTTP/1.1\r\n{head}content-length: {len(ep.body)}\r\n\r\n"
                        .encode() + ep.body)

    def once(self) -> float:
        t0 = perf_counter_ns()
        self.sock.sendall(self.request)
        buf = b""
        while (i := buf.find(b"\r\n\r\n")) < 0:
            buf += self._recv()
        head, body = buf[:i].lower(), buf[i + 4:]
        if b"transfer-encoding: chunked" in head:
            while not body.endswith(b"0\r\n\r\n"):
                body += self._recv()
        else:
            length = int(head.split(b"content-length:")[1].split(b"\r\n")[0])
            while len(body) < length:
                body += self._recv()
        return (perf_counter_ns() - t0) / 1e6

    def _recv(self) -> bytes:
        data = self.sock.recv(65536)
        if not data:
            raise ConnectionError("server closed the connection")
        return data

    def close(self) -> None:
        self.sock.close()


def overhead(url: str, n: int, stream: bool) -> dict[str, Any]:
    cfg = SplitConfig(num_requests=n, stream=stream, max_tokens=8, warmup=0)
    ep = Endpoint.build(Target("null", url), cfg)
    bare, inst = BareClient(ep), Session(ep, cfg, None)
    bare_ms: list[float] = []
    inst_ms: list[float] = []
    try:
        for _ in range(20):  # warm both connections and code paths
            bare.once()
            inst.measure(0, 0, 0, 0)
        for i in range(n):
            # strictly alternating (order swapped every pair): both clients meet the same server
            # state; in long blocks the engine's idle/busy rhythm follows each client's pacing
            order = ("bare", "inst") if i % 2 == 0 else ("inst", "bare")
            for who in order:
                if who == "bare":
                    bare_ms.append(bare.once())
                else:
                    s = inst.measure(0, 0, 0, 0)
                    if not s.ok or s.total_ms is None:
                        raise RuntimeError(f"instrumented request failed: {s.error}")
                    inst_ms.append(s.total_ms)
    finally:
        bare.close()
        inst.close()
    diff = median_difference(bare_ms, inst_ms, resamples=2000)
    b, i = summarize(bare_ms), summarize(inst_ms)
    ratio = diff.interval.estimate / b["p50"]
    return {"stream": stream, "requests": n, "bare_p50_ms": b["p50"], "bare_p99_ms": b["p99"],
            "instrumented_p50_ms": i["p50"], "instrumented_p99_ms": i["p99"],
            "overhead_ms": diff.interval.estimate, "overhead_lo_ms": diff.interval.lo,
            "overhead_hi_ms": diff.interval.hi, "overhead_verdict": diff.verdict, "overhead_ratio": ratio,
            "meets_target": ratio < TARGET_RATIO}


def paths(model: str, n: int, stream: bool) -> dict[str, Any]:
    names = ("direct", "nginx", "pygw", "stack")
    with LocalStack(StackConfig(model=model, paths=("nginx", "pygw", "stack"))) as st:
        targets = [Target(k, st.urls[k]) for k in names]
        cfg = SplitConfig(num_requests=n, stream=stream, max_tokens=16, warmup=2, rounds=4)
        res = analyse(targets, measure_targets(targets, cfg), cfg)
    out: dict[str, Any] = {"model": model, "stream": stream, "requests": n, "paths": {}, "tax_vs_direct": {}}
    for tr in res.targets:
        row = {"ok": tr.num_ok, "errors": tr.errors}
        for m in ("total_ms", "ttfb_ms", "ttft_ms", "tpot_ms", "network_client_ms", "gw_other_ms"):
            p = phase(tr, m)
            if p is not None:
                row[m] = {"p50": p.summary.get("p50"), "lo": p.median_lo, "hi": p.median_hi}
        out["paths"][tr.name] = row
    for d in res.differences:
        if d.phase in ("total_ms", "ttft_ms", "ttfb_ms", "network_client_ms", "gw_other_ms"):
            out["tax_vs_direct"].setdefault(d.candidate, {})[d.phase] = {
                "diff_ms": d.diff_ms, "lo": d.lo_ms, "hi": d.hi_ms, "verdict": d.verdict}
    return out


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v:8.3f}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--requests", type=int, default=400, help="requests per client in the overhead part")
    ap.add_argument("--split-requests", type=int, default=24, help="requests per path in the dummy:small part")
    ap.add_argument("--skip-dummy", action="store_true", help="only the overhead part")
    args = ap.parse_args()
    figures: dict[str, Any] = {"target_overhead_ratio": TARGET_RATIO}

    with LocalStack(StackConfig(model="null", paths=())) as st:
        rows = [overhead(st.urls["direct"], args.requests, stream) for stream in (False, True)]
    figures["overhead"] = rows
    print("client overhead vs a bare socket loop (model null, keep-alive, c=1, ms)")
    print(f"{'mode':10} {'bare p50':>9} {'inst p50':>9} {'overhead':>9} {'95% CI':>20} {'ratio':>7}  target<5%")
    for r in rows:
        ci = f"[{r['overhead_lo_ms']:.3f}, {r['overhead_hi_ms']:.3f}]"
        print(f"{'stream' if r['stream'] else 'no-stream':10} {_ms(r['bare_p50_ms'])} {_ms(r['instrumented_p50_ms'])}"
              f" {_ms(r['overhead_ms'])} {ci:>20} {r['overhead_ratio'] * 100:6.1f}%  "
              f"{'yes' if r['meets_target'] else 'NO'}")

    if not args.skip_dummy:
        split = paths("dummy:small", args.split_requests, True)
        figures["dummy_small"] = split
        print(f"\npaths on dummy:small (stream, max_tokens 16, n={args.split_requests} each; p50 ms [95% CI])")
        print(f"{'path':8} {'total':>24} {'ttft':>24} {'tpot':>9}  tax vs direct (total)")
        for name, row in split["paths"].items():
            def cell(m: str, row: dict[str, Any] = row) -> str:
                v = row.get(m)
                return "-" if v is None else f"{v['p50']:.2f} [{v['lo']:.2f}, {v['hi']:.2f}]"
            tax = split["tax_vs_direct"].get(name, {}).get("total_ms")
            tax_s = "" if tax is None else (f"{tax['diff_ms']:+.2f} [{tax['lo']:+.2f}, {tax['hi']:+.2f}] "
                                            f"{tax['verdict']}")
            tpot = row.get("tpot_ms")
            print(f"{name:8} {cell('total_ms'):>24} {cell('ttft_ms'):>24} "
                  f"{'-' if tpot is None else format(tpot['p50'], '9.3f')}  {tax_s}")
    print(json.dumps(figures))
    sys.stdout.flush()


if __name__ == "__main__":
    main()

"""The gateway's cost in money (issue 39 item 6): CPU seconds per request of each local process group (read by
--cpu-pid, zgtool.latency.schedule.cputime) times a core-hour price, as dollars per million output tokens; and,
with a GPU-hour price, the engine's GPU time per request (the GPU held for the path's measured wall time).

A path's gateway cost is its non-engine process groups' CPU during its blocks less what the same groups used
while the baseline (first target) ran, as zgtool.report.tax does for CPU ms: idle work (timers, health checks)
is not charged to the hop. A process the client cannot read (remote, or not given with --cpu-pid) is "not
measured", never zero.
"""

from __future__ import annotations

from typing import Any

from zgtool.latency.records import SplitResult, TargetResult

ENGINE_PROCESS = "engine"          # the --cpu-pid name of the engine's process group (zgtool.report.tax's too)
NOT_MEASURED = ("not measured: no local process of this path was given with --cpu-pid NAME=PID (a remote "
                "gateway's CPU cannot be read from here)")


def _per_million(usd_per_request: float, tokens_per_request: float | None) -> float | None:
    return usd_per_request / tokens_per_request * 1e6 if tokens_per_request else None


def _tokens_per_request(tr: TargetResult) -> float | None:
    tp = tr.throughput
    if tp is None or not tp.requests_ok or not tp.output_tokens:
        return None
    return tp.output_tokens / tp.requests_ok


def _target(tr: TargetResult, base: TargetResult, core_usd_s: float | None,
            gpu_usd_s: float | None) -> dict[str, Any]:
    tok = _tokens_per_request(tr)
    row: dict[str, Any] = {"name": tr.name, "output_tokens_per_request": None if tok is None else round(tok, 3)}
    cpu = tr.cpu_ms_per_request or {}
    if core_usd_s is None:
        pass
    elif cpu:
        row["processes"] = {name: {"cpu_s_per_request": ms / 1e3,
                                   "usd_per_million_output_tokens": _per_million(ms / 1e3 * core_usd_s, tok)}
                            for name, ms in cpu.items()}
        gw = [n for n in cpu if n != ENGINE_PROCESS]
        if gw and tr is not base:
            idle = base.cpu_ms_per_request or {}
            gw_s = max(0.0, sum(cpu[n] for n in gw) - sum(idle.get(n, 0.0) for n in gw)) / 1e3
            row["gateway"] = {"processes": gw, "cpu_s_per_request": gw_s,
                              "usd_per_million_requests": gw_s * core_usd_s * 1e6,
                              "usd_per_million_output_tokens": _per_million(gw_s * core_usd_s, tok)}
    else:
        row["not_measured"] = NOT_MEASURED
    tp = tr.throughput
    if gpu_usd_s is not None and tp is not None and tp.requests_ok:
        gpu_s = tp.duration_s / tp.requests_ok
        row["engine_gpu"] = {"gpu_s_per_request": gpu_s, "usd_per_million_output_tokens": _per_million(gpu_s * gpu_usd_s, tok),
                             "how": "the engine's GPU(s) held for this path's measured wall time / its answered requests"}
    return row


def cost(res: SplitResult, core_hour_price_usd: float | None, gpu_hour_price_usd: float | None = None) -> dict[str, Any]:
    """The result's `cost`: per target, each process group's and the gateway's dollars per million output tokens."""
    base = res.targets[0]
    core_usd_s = None if core_hour_price_usd is None else core_hour_price_usd / 3600.0
    gpu_usd_s = None if gpu_hour_price_usd is None else gpu_hour_price_usd / 3600.0
    return {"core_hour_price_usd": core_hour_price_usd, "gpu_hour_price_usd": gpu_hour_price_usd,
            "targets": [_target(tr, base, core_usd_s, gpu_usd_s) for tr in res.targets]}


def usd(v: float) -> str:
    """$0.42, $12.00; under ten cents three significant digits ($0.00301)."""
    return f"${v:.2f}" if v >= 0.1 else f"${v:.3g}"


def cost_lines(data: dict[str, Any]) -> list[str]:
    """One line per candidate path for the verdict: what its gateway costs per million output tokens."""
    out = []
    price = data["core_hour_price_usd"]
    for row in data["targets"][1:] if price is not None else ():
        gw = row.get("gateway")
        if gw is None:
            why = row.get("not_measured") or "not measured: only the engine's process was given with --cpu-pid"
            out.append(f"{row['name']}: the gateway's cost is {why}")
            continue
        per_tok = gw["usd_per_million_output_tokens"]
        money = (f"{usd(per_tok)} per million output tokens" if per_tok is not None
                 else f"{usd(gw['usd_per_million_requests'])} per million requests (no output token counts)")
        out.append(f"{row['name']}: its gateway ({', '.join(gw['processes'])}) costs {money} at ${price:g} per "
                   f"core-hour ({gw['cpu_s_per_request'] * 1e3:.3f} CPU ms per request)")
    for row in data["targets"]:
        g = row.get("engine_gpu")
        if g is not None and g["usd_per_million_output_tokens"] is not None:
            out.append(f"{row['name']}: the engine's GPU time costs {usd(g['usd_per_million_output_tokens'])} per "
                       f"million output tokens at ${data['gpu_hour_price_usd']:g} per GPU-hour "
                       f"({g['gpu_s_per_request'] * 1e3:.1f} GPU ms per request held)")
    return out

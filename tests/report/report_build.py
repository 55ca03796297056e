"""Build latency_split result dicts for report tests: a config, two paths and the differences a
run measured, in the result schema's shape (zgtool.result/1, kind latency_split)."""

from __future__ import annotations

from typing import Any

ENGINE = ("prefill_ms", "decode_ms", "engine_other_ms")


def diff(phase: str, diff_ms: float, lo_ms: float, hi_ms: float, candidate: str = "stack",
         **extra: Any) -> dict[str, Any]:
    verdict = "higher" if lo_ms > 0 else "lower" if hi_ms < 0 else "not significant"
    return {"phase": phase, "baseline": "direct", "candidate": candidate, "diff_ms": diff_ms, "lo_ms": lo_ms,
            "hi_ms": hi_ms, "verdict": verdict, "method": "rounds", "rounds": 10, **extra}


def target(name: str, total_p50: float, *, engine: bool = True, samples: list[dict[str, Any]] | None = None,
           **extra: Any) -> dict[str, Any]:
    phases: dict[str, Any] = {
        "total_ms": {"count": 30, "summary": {"p50": total_p50, "mean": total_p50}, "median_lo": total_p50 * 0.9,
                     "median_hi": total_p50 * 1.1, "waterfall_mean_ms": None},
        "network_client_ms": {"count": 30, "summary": {"p50": 1.0}, "median_lo": 0.5, "median_hi": 1.5,
                              "waterfall_mean_ms": 1.0 if engine else total_p50},
    }
    if engine:
        for p in ENGINE:
            phases[p] = {"count": 30, "summary": {"p50": total_p50 / 3}, "median_lo": 0.0, "median_hi": 1.0,
                         "waterfall_mean_ms": total_p50 / 3}
    return {"name": name, "url": f"http://127.0.0.1/{name}", "api": "openai", "phases": phases,
            "samples": samples or [], "num_ok": 30, "num_error": 0, **extra}


def split(diffs: list[dict[str, Any]], *, stream: bool = False, concurrency: int = 1,
          direct_ms: float = 100.0, stack_ms: float | None = None, engine: tuple[bool, bool] = (True, True),
          notes: list[str] | None = None, environment: dict[str, Any] | None = None,
          targets: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    waterfall = ["network_client_ms", *ENGINE] if all(engine) else ["network_client_ms"]
    return {"schema": "zgtool.result/1", "kind": "latency_split", "command": "zgtool latency-split",
            "created": "2026-12-04T15:00:00+00:00", "target": None,
            "environment": environment or {"host": "h", "zgtool": "0"},
            "data": {"config": {"stream": stream, "concurrency": concurrency, "num_requests": 30},
                     "targets": targets or [target("direct", direct_ms, engine=engine[0]),
                                            target("stack", stack_ms or direct_ms, engine=engine[1])],
                     "differences": diffs, "waterfall_phases": waterfall,
                     "metric_phases": ["ttfb_ms", "ttft_ms", "total_ms"] if stream else ["ttfb_ms", "total_ms"],
                     "attribution_notes": notes or []}}

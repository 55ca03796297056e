"""zgtool serve beside the engines people would otherwise run, on the same weights.

Serves one Hugging Face directory (the real model `smollm2` when its package is installed, and
`dummy:small` written as an HF directory) with `zgtool serve` and each installed peer -- vLLM's
CPU build, llama.cpp (llama-cpp-python's server, one request at a time, and the C++
`llama-server` with one parallel slot per stream, both on a GGUF of the same weights) and
`transformers serve --continuous-batching` (its KV cache capped) -- ONE SERVER AT A TIME, in alternating order
(A B C, C B A, ...), every server restarted per cycle. Each run gets the same streaming workload
through POST /v1/chat/completions: temperature 0, equal output lengths (`ignore_eos` +
`min_tokens` where the server takes them; for the others only prompts whose greedy output
has no EOS within the length are used, screened on zgtool first), first N concurrent
streams, then single streams one after another. Every server gets the same compute thread
count. Per engine (medians over cycles): output tok/s at c=N and c=1, TTFT p50/p95 and ITL p50
at c=N, TTFT p50 at c=1, peak RSS of its process tree and start-up time (spawn -> first 200
on its health/models route); then zgtool/peer ratios. A peer that is not installed is one
"skipped" line, never a figure. Peers are installed by bench/setup_peers.sh.

Requests never repeat within a server's run: the warm-up, the c=N round and the c=1 round each
send prompts the server has not seen (a repeat would be a prefix-cache hit flattering TTFT and
tok/s). zgtool also runs `--dtype auto` (row zgtool:auto, compared with each peer's best row) and
bfloat16 (zgtool:bf16) unless --zgtool-rows says otherwise. The JSON records the CPU's flags and
each run's load average; every ratio is also printed per cycle as the median and min-max of the
paired per-cycle ratios, with the confidence that min-max covers the median (6 cycles by default:
the fewest for >= 95%).

Every engine runs in up to two dtypes (--dtypes): the run's dtype (--dtype; the row is the
engine's name; llama.cpp gets a GGUF converted to it) and its own best (row "<engine>:best":
zgtool int8 where `zgtool serve --dtype` offers it, else bfloat16; vLLM and transformers
bfloat16; llama.cpp the package's Q4_1 GGUF, or q8_0 from its converter for dummy models). A best variant equal to the run's dtype is not
run twice. Ratios pair like with like: zgtool/peer, and zgtool:best/peer:best.

    .venv/bin/python bench/peers.py [--models dummy,smollm2]
        [--peers vllm,llama,llama-server,transformers|all|none] [--dtypes same,best]
        [--cycles 6] [--concurrency 16] [--max-tokens 96] [--c1-requests 3] [--threads 2]
        [--zgtool-rows auto,bf16]

Prints a table per model and, as the LAST line, one JSON object with every figure and ratio.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
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

_LIB = Path(__file__).resolve().parent / "peerlib"      # this benchmark's helper modules (not benchmarks)
if str(_LIB) not in sys.path:
    sys.path.insert(0, str(_LIB))

import peers_gguf  # noqa: E402
from machine import cpu_flags, cpu_model  # noqa: E402
from peers_llama_server import llama_server_spec  # noqa: E402
from peers_types import (  # noqa: E402
    BEST,
    SAME,
    SETUP_HINT,
    GgufFile,
    ModelCase,
    ServerSpec,
    Skip,
    engine_of,
    peers_dir,
    row_name,
)

__all__ = ["GgufFile", "ModelCase", "ServerSpec", "Skip", "SETUP_HINT", "peers_dir"]

PEER_NAMES = ("vllm", "llama", "llama-server", "transformers")
VARIANTS = (SAME, BEST)
# each peer's best dtype on a CPU (llama.cpp's is its GGUF's: the package's Q4_1)
PEER_BEST_DTYPE = {"vllm": "bfloat16", "transformers": "bfloat16"}
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
WARM_PROMPT = "Say hello."  # the warm-up's: never a measured request's


# -- what a run measured ---------------------------------------------------------------------
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
    load_avg_1m: float = float("nan")      # the box's 1-minute load average as the run started
    load_avg_1m_end: float = float("nan")  # and as it ended: a busy box reads lower on every figure


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
    c1_tok_s_runs: list[float] = field(default_factory=list)
    c1_ttft_p50_runs: list[float] = field(default_factory=list)
    load_avg_1m_runs: list[float] = field(default_factory=list)  # per cycle, as each run started


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


def zgtool_best_dtype(serve_help: str, requested: str = "auto") -> str:
    """zgtool's best CPU dtype: int8 once `zgtool serve --dtype` offers it, else bfloat16."""
    if requested != "auto":
        return requested
    return "int8" if "int8" in dtype_help(serve_help) else "bfloat16"


def dtype_help(serve_help: str) -> str:
    """The text of `zgtool serve --help` that describes --dtype (its line and continuation lines)."""
    block: list[str] = []
    for line in serve_help.splitlines():
        if block and re.search(r"(^|[\s│|])--[a-z]", line):
            break
        if block or re.search(r"(^|[\s│|])--dtype\b", line):
            block.append(line)
    return "\n".join(block)


def zgtool_spec(case: ModelCase, port: int, threads: int, dtype: str, serve_help: str,
                row: str = "zgtool") -> ServerSpec:
    argv = [sys.executable, "-m", "zgtool", "serve", "--model", str(case.hf_dir), "--port", str(port),
            "--device", "cpu", "--dtype", dtype, "--max-num-seqs", "32"]
    env = {"OMP_NUM_THREADS": str(threads)}
    if "--num-threads" in serve_help:
        argv += ["--num-threads", str(threads)]
    return ServerSpec(row, tuple(argv), env, "/health", "default",
                      {"ignore_eos": True}, True, dtype, usage_in_stream=True)


def vllm_spec(case: ModelCase, port: int, threads: int, dtype: str, row: str = "vllm") -> ServerSpec | Skip:
    venv = peers_dir() / "vllm"
    if not (venv / ".ok").exists():
        return Skip(row, f"skipped: not installed ({SETUP_HINT})")
    argv = [str(venv / "bin" / "python"), "-m", "vllm.entrypoints.openai.api_server", "--model", str(case.hf_dir),
            "--served-model-name", "m", "--dtype", dtype, "--host", "127.0.0.1", "--port", str(port),
            "--max-model-len", "2048", "--max-num-seqs", "32"]
    # its thread count comes from the bind list; an OMP_NUM_THREADS next to it makes vLLM keep
    # spin-waiting torch threads (it warns so)
    env = {"VLLM_CPU_OMP_THREADS_BIND": f"0-{threads - 1}", "VLLM_CPU_KVCACHE_SPACE": "1"}
    pre = _preload_libs(venv)
    if pre:
        env["LD_PRELOAD"] = pre
    return ServerSpec(row, tuple(argv), env, "/v1/models", "m",
                      {"ignore_eos": True, "min_tokens": 0}, True, dtype,  # min_tokens := max_tokens per body
                      usage_in_stream=True)


def llama_spec(case: ModelCase, port: int, threads: int, gguf: GgufFile | None, row: str = "llama",
               note: str = "") -> ServerSpec | Skip:
    """llama-cpp-python's server: one request at a time (no usage in its stream)."""
    venv = peers_dir() / "llama"
    if not (venv / ".ok").exists():
        return Skip(row, f"skipped: not installed ({SETUP_HINT})")
    if gguf is None:
        return Skip(row, f"skipped: no GGUF of {case.name} ({note or case.gguf_note})")
    argv = [str(venv / "bin" / "python"), "-m", "llama_cpp.server", "--model", str(gguf.path),
            "--model_alias", "m", "--host", "127.0.0.1", "--port", str(port), "--n_ctx", "4096",
            "--n_threads", str(threads), "--n_threads_batch", str(threads), "--interrupt_requests", "False"]
    return ServerSpec(row, tuple(argv), {"OMP_NUM_THREADS": str(threads)}, "/v1/models", "m",
                      {"repeat_penalty": 1.0}, False, gguf.dtype)


def transformers_spec(case: ModelCase, port: int, threads: int, dtype: str, row: str = "transformers",
                      cb_num_blocks: int = 512) -> ServerSpec | Skip:
    """`transformers serve --continuous-batching`, its paged cache capped (uncapped it grew to ~13 GiB)."""
    tf = Path(sys.executable).with_name("transformers")
    if not tf.exists():
        return Skip(row, "skipped: not installed (scripts/setup.sh installs it with the test extras)")
    argv = [str(tf), "serve", "--continuous-batching", "--host", "127.0.0.1", "--port", str(port),
            "--device", "cpu", "--dtype", dtype, "--cb-num-blocks", str(cb_num_blocks), str(case.hf_dir)]
    return ServerSpec(row, tuple(argv), {"OMP_NUM_THREADS": str(threads)}, "/health",
                      str(case.hf_dir), {}, False, dtype)


def peer_spec(engine: str, variant: str, case: ModelCase, port: int, args: argparse.Namespace,
              serve_help: str) -> ServerSpec | Skip | None:
    """The server of one table row; None when that row would repeat the same-dtype one."""
    row = row_name(engine, variant)
    best = variant == BEST
    if engine == "zgtool":
        dtype = zgtool_best_dtype(serve_help, args.zgtool_best_dtype) if best else args.dtype
        if best and dtype == args.dtype:
            return None
        return zgtool_spec(case, port, args.zgtool_threads or args.threads, dtype, serve_help, row)
    if engine in ("llama", "llama-server"):
        gguf = case.gguf_best if best else case.gguf_same
        if best and gguf is not None and case.gguf_same is not None and gguf.dtype == case.gguf_same.dtype:
            return None
        note = case.gguf_note or ("no best-dtype GGUF" if best else "no same-dtype GGUF")
        if engine == "llama":
            return llama_spec(case, port, args.threads, gguf, row, note)
        return llama_server_spec(row, gguf, note, port, args.threads, args.concurrency, args.max_tokens)
    dtype = PEER_BEST_DTYPE.get(engine, args.dtype) if best else args.dtype
    if best and dtype == args.dtype:
        return None
    if engine == "vllm":
        return vllm_spec(case, port, args.threads, dtype, row)
    return transformers_spec(case, port, args.threads, dtype, row)


ZG_AUTO, ZG_BF16 = "zgtool:auto", "zgtool:bf16"


def zgtool_extra_rows(args: argparse.Namespace) -> list[tuple[str, str]]:
    """zgtool's rows beyond same/best (--zgtool-rows): `--dtype auto` (what a user gets: the issue's
    comparison with each peer's best) and bfloat16, each unless the run's dtype already is it."""
    rows = {"auto": (ZG_AUTO, "auto"), "bf16": (ZG_BF16, "bfloat16")}
    bad = [r for r in args.zgtool_rows if r not in rows]
    if bad:
        raise SystemExit(f"unknown --zgtool-rows {bad}: choose from auto, bf16")
    return [rows[r] for r in args.zgtool_rows if rows[r][1] != args.dtype]


# -- models ----------------------------------------------------------------------------------
def prepare_model(name: str, tmp: Path, want_gguf: bool, dtype: str = "float32") -> ModelCase | Skip:
    if name.startswith("dummy:"):
        from zgtool.engine.weights import save_dummy_checkpoint

        path = save_dummy_checkpoint(name.split(":", 1)[1], tmp / name.replace(":", "-"))
        cfg_path = path / "tokenizer_config.json"
        cfg = json.loads(cfg_path.read_text())
        cfg["chat_template"] = DUMMY_CHAT_TEMPLATE
        cfg_path.write_text(json.dumps(cfg))
        if not want_gguf:
            return ModelCase(name, path, None, None, "llama.cpp not requested", _eos_ids(path))
        same = peers_gguf.same_dtype_gguf(path, dtype, cache=False, tmp=tmp, byte_vocab=True)
        if isinstance(same, str):
            return ModelCase(name, path, None, None, same, _eos_ids(path))
        # no quantised file of random weights ships; llama.cpp's converter writes q8_0 itself
        best = peers_gguf.convert(path, tmp / f"{path.name}.q8_0.gguf", "q8_0", byte_vocab=True)
        return ModelCase(name, path, same, same if isinstance(best, str) else best, "", _eos_ids(path))
    if name == "smollm2":
        try:
            from zgtool.engine import gguf_convert

            hf = Path(gguf_convert.ensure_converted("smollm2"))
            packaged = Path(gguf_convert.find_gguf(gguf_convert.SMOLLM2))
        except Exception as exc:  # noqa: BLE001 - reported as a skip line
            return Skip(name, f"skipped: {type(exc).__name__}: {exc}")
        best = GgufFile(peers_gguf.gguf_dtype_of(packaged), packaged, "the package's own GGUF")
        if not want_gguf:
            return ModelCase(name, hf, None, best, "llama.cpp not requested", _eos_ids(hf))
        same = peers_gguf.same_dtype_gguf(hf, dtype, cache=True, tmp=tmp)
        if isinstance(same, str):
            return ModelCase(name, hf, None, best, same, _eos_ids(hf))
        return ModelCase(name, hf, same, best, "", _eos_ids(hf))
    path = Path(name).expanduser()
    if (path / "config.json").exists():
        return ModelCase(path.name, path, None, None, "no GGUF for a plain directory", _eos_ids(path))
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
    if stream and spec.usage_in_stream:
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


def round_prompts(prompts: list[str], concurrency: int, c1_requests: int) -> tuple[list[str], list[str]]:
    """The c=N round's prompts and the c=1 round's, every request's prompt unseen by the server
    (the warm-up sends WARM_PROMPT, in neither list): a prompt sent twice would be a prefix-cache
    hit that flatters the later round's TTFT and tok/s (the c=1 round once re-sent three prompts of
    the c=N round). Where the list is short, a repeat gets a distinct tag in front."""
    need = concurrency + c1_requests
    uniq = [prompts[i] if i < len(prompts) else f"(request {i}) {prompts[i % len(prompts)]}" for i in range(need)]
    return uniq[:concurrency], uniq[concurrency:]


def measure_run(spec: ServerSpec, port: int, log: Path, cycle: int, prompts: list[str], concurrency: int,
                max_tokens: int, c1_requests: int,
                on_ready: Callable[[str], None] | None = None) -> RunFigures:
    url = f"http://127.0.0.1:{port}"
    load0 = os.getloadavg()[0]
    with running(spec, port, log) as (proc, startup_s):
        if on_ready is not None:
            on_ready(url)
        with RssSampler(proc.pid) as rss:
            warm = [body_for(spec, WARM_PROMPT, 4)] * 2
            asyncio.run(run_load(url, warm, 2))
            c_prompts, c1_prompts = round_prompts(prompts, concurrency, c1_requests)
            bodies = [body_for(spec, p, max_tokens) for p in c_prompts]
            c_res, c_wall = asyncio.run(run_load(url, bodies, concurrency))
            singles = [body_for(spec, p, max_tokens) for p in c1_prompts]
            c1_res, c1_wall = asyncio.run(run_load(url, singles, 1))
    errs = [r.error for r in c_res + c1_res if r.error]
    for e in errs[:3]:
        print(f"  {spec.name} error: {e}", file=sys.stderr)
    return RunFigures(
        spec.name, cycle, startup_s, rss.peak_mb,
        sum(r.tokens for r in c_res) / c_wall, [r.ttft_ms for r in c_res if r.ttft_ms is not None],
        [x for r in c_res for x in r.itl_ms], sum(r.tokens for r in c_res),
        sum(r.tokens for r in c1_res) / c1_wall, [r.ttft_ms for r in c1_res if r.ttft_ms is not None],
        [x for r in c1_res for x in r.itl_ms], len(errs), load0, os.getloadavg()[0])


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
        errors=sum(r.errors for r in runs), c_tok_s_runs=[round(r.c_tok_s, 1) for r in runs],
        c1_tok_s_runs=[round(r.c1_tok_s, 2) for r in runs],
        c1_ttft_p50_runs=[round(percentile(r.c1_ttft_ms, 50), 1) for r in runs], load_avg_1m_runs=[round(r.load_avg_1m, 2) for r in runs])


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
    by = {s.engine: s for s in summaries}
    head = (f"{'engine':<18}{'dtype':<10}{f'tok/s c={c}':>11}{'tok/s c=1':>10}{'TTFT p50':>10}{'TTFT p95':>10}"
            f"{'ITL p50':>9}{'TTFT c=1':>10}{'RSS MB':>8}{'start s':>8}{'err':>5}")
    lines = [f"== {model} ==", head]
    for s in summaries:
        lines.append(f"{s.engine:<18}{s.dtype[:9]:<10}{s.c_tok_s:>11.1f}{s.c1_tok_s:>10.1f}{s.c_ttft_p50_ms:>10.0f}"
                     f"{s.c_ttft_p95_ms:>10.0f}{s.c_itl_p50_ms:>9.1f}{s.c1_ttft_p50_ms:>10.0f}{s.rss_mb:>8.0f}"
                     f"{s.startup_s:>8.1f}{s.errors:>5}")
    for sk in skips:
        lines.append(f"{sk.name:<18}{sk.reason}")
    for peer, r in rat.items():
        def f(k: str, r: dict[str, float | None] = r) -> str:
            v = r.get(k)
            return "n/a" if v is None else f"x{v:.2f}"
        lines.append(f"{ratio_label(peer, by)}: tok/s c={c} {f('c_tok_s')}, c=1 {f('c1_tok_s')}; TTFT p50 c={c} {f('c_ttft_p50')}, "
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


def log_name(model: str, row: str) -> str:
    return f"{model}-{row}.log".replace(":", "-").replace("/", "_")


def gguf_summary(case: ModelCase) -> dict[str, str | None]:
    def one(g: GgufFile | None) -> str | None:
        return None if g is None else f"{g.dtype}: {g.path}"
    return {SAME: one(case.gguf_same), BEST: one(case.gguf_best), "note": case.gguf_note or None}


def pair_ratios(by: dict[str, EngineSummary]) -> dict[str, dict[str, float | None]]:
    """zgtool over each peer row, like with like: "llama" against zgtool, "llama:best" against
    zgtool:best (zgtool where it has no best row of its own); and zgtool's `--dtype auto` row
    against each peer's best row (its same-dtype row where it has none), keyed "zgtool:auto/<row>"."""
    out: dict[str, dict[str, float | None]] = {}
    for name, s in by.items():
        if engine_of(name) == "zgtool":
            continue
        ours = by.get(row_name("zgtool", BEST)) if name.endswith(f":{BEST}") else None
        ours = ours or by.get("zgtool")
        if ours is not None:
            out[name] = ratios(ours, s)
    auto = by.get(ZG_AUTO)
    for name in list(by):
        best = name if name.endswith(f":{BEST}") else row_name(name, BEST)
        if auto is not None and engine_of(name) != "zgtool" and (name == best or best not in by):
            out[f"{ZG_AUTO}/{name}"] = ratios(auto, by[name])
    return out


def pair_key(key: str, by: dict[str, EngineSummary]) -> tuple[str, str]:
    """(our row, the peer's row) of a pair_ratios key."""
    if "/" in key:
        ours, peer = key.split("/", 1)
        return ours, peer
    return ("zgtool:best" if key.endswith(f":{BEST}") and "zgtool:best" in by else "zgtool"), key


def ratio_label(peer_row: str, rat_rows: dict[str, EngineSummary]) -> str:
    return "/".join(pair_key(peer_row, rat_rows))


def order_interval(values: list[float]) -> dict[str, Any]:
    """The median of per-cycle paired ratios and their min-max: for n >= 2 independent cycles the
    min-max covers the true median with probability 1 - 2^(1-n) (n=3: 75%, 5: 93.8%, 6: 96.9%,
    which is why --cycles defaults to 6: the fewest whose interval reaches 95%)."""
    vals = [v for v in values if v == v]
    n = len(vals)
    if not n:
        return {"median": None, "lo": None, "hi": None, "cycles": 0, "confidence": None}
    return {"median": round(statistics.median(vals), 3), "lo": round(min(vals), 3), "hi": round(max(vals), 3),
            "cycles": n, "confidence": round(1 - 2 ** (1 - n), 3) if n >= 2 else None}


def paired_intervals(by: dict[str, EngineSummary], keys: list[str]) -> dict[str, dict[str, Any]]:
    """Per pair_ratios key: the per-cycle ratios of tok/s at c=N and c=1 and of c=1 TTFT p50, each
    as order_interval (the cycles pair up in order: both servers ran in the same cycle)."""
    out = {}
    for key in keys:
        ours, peer = (by[k] for k in pair_key(key, by))

        def per_cycle(a: list[float], b: list[float]) -> list[float]:
            return [x / y for x, y in zip(a, b, strict=False) if y]

        out[key] = {"c_tok_s": order_interval(per_cycle(ours.c_tok_s_runs, peer.c_tok_s_runs)),
                    "c1_tok_s": order_interval(per_cycle(ours.c1_tok_s_runs, peer.c1_tok_s_runs)),
                    "c1_ttft_p50": order_interval(per_cycle(ours.c1_ttft_p50_runs, peer.c1_ttft_p50_runs))}
    return out


def render_intervals(iv: dict[str, dict[str, Any]]) -> list[str]:
    lines = []
    for key, figs in iv.items():
        parts = []
        for name, f in figs.items():
            if f["median"] is not None:
                conf = f" ({100 * f['confidence']:.1f}% over {f['cycles']} cycles)" if f["confidence"] else " (1 cycle)"
                parts.append(f"{name} x{f['median']:.2f} [{f['lo']:.2f}, {f['hi']:.2f}]{conf}")
        lines.append(f"{key} per-cycle ratios: " + "; ".join(parts))
    return lines


def bench_model(case: ModelCase, peers: list[str], args: argparse.Namespace, tmp: Path,
                serve_help: str) -> dict[str, Any]:
    specs: dict[str, ServerSpec] = {}
    skips: list[Skip] = []
    ports: dict[str, int] = {}
    for engine in ["zgtool", *peers]:
        for variant in args.dtypes:
            name = row_name(engine, variant)
            port = ports[name] = free_port()
            spec = peer_spec(engine, variant, case, port, args, serve_help)
            if spec is None:
                continue
            if isinstance(spec, Skip):
                skips.append(spec)
                print(f"{spec.name}: {spec.reason}", file=sys.stderr)
            else:
                specs[name] = spec
    for row, dtype in zgtool_extra_rows(args):
        ports[row] = free_port()
        specs[row] = zgtool_spec(case, ports[row], args.zgtool_threads or args.threads, dtype, serve_help, row)
    prompts = list(CANDIDATE_PROMPTS[: args.concurrency + args.c1_requests])
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
                kept = screen_prompts(url, spec, CANDIDATE_PROMPTS, args.max_tokens,
                                      args.concurrency + args.c1_requests)
                print(f"  screened prompts: {len(kept)} of {len(CANDIDATE_PROMPTS)} run {args.max_tokens} tokens "
                      "without EOS", file=sys.stderr)
                if kept:
                    prompts = kept

            hook = screen if (cycle == 0 and name == "zgtool" and need_screen) else None
            try:
                fig = measure_run(spec, ports[name], logs / log_name(case.name, name), cycle,
                                  prompts, args.concurrency, args.max_tokens, args.c1_requests, hook)
            except RuntimeError as exc:
                failed[name] = f"failed: {exc}"
                print(f"  {name}: {failed[name]}", file=sys.stderr)
                continue
            runs[name].append(fig)
            print(f"  cycle {cycle} {name:<12} c={args.concurrency} {fig.c_tok_s:7.1f} tok/s, c=1 {fig.c1_tok_s:6.1f} tok/s, "
                  f"TTFT p50 {percentile(fig.c_ttft_ms, 50):7.0f} ms, start {fig.startup_s:5.1f} s, "
                  f"RSS {fig.rss_peak_mb:6.0f} MB, errors {fig.errors}, load {fig.load_avg_1m:.2f}", file=sys.stderr)
    skips += [Skip(n, r) for n, r in failed.items() if not runs[n]]
    summaries = [summarize(n, specs[n].dtype, rs) for n, rs in runs.items() if rs]
    by = {s.engine: s for s in summaries}
    rat = pair_ratios(by)
    iv = paired_intervals(by, [k for k in rat if all(r in by for r in pair_key(k, by))])
    print(render(case.name, args.concurrency, summaries, skips, rat))
    for line in render_intervals(iv):
        print(line)
    return {"model": case.name, "hf_dir": str(case.hf_dir), "gguf": gguf_summary(case),
            "engines": [asdict(s) for s in summaries], "skipped": {s.name: s.reason for s in skips},
            "ratios_zgtool_over_peer": rat, "ratio_intervals": iv,
            "screened_prompts": len(prompts) if need_screen else None}


def parse_dtypes(value: str) -> list[str]:
    names = [v.strip() for v in value.split(",") if v.strip()]
    bad = [n for n in names if n not in VARIANTS]
    if bad or not names:
        raise SystemExit(f"unknown dtype variant(s) {bad or value!r}: choose from {', '.join(VARIANTS)}")
    return [v for v in VARIANTS if v in names]


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--models", default=None, help="comma list: dummy:small, smollm2, an HF dir (default: both "
                    "when the smollm2 package is installed)")
    ap.add_argument("--peers", default="all", help="vllm,llama,llama-server,transformers | all | none")
    ap.add_argument("--cycles", type=int, default=6,
                    help="alternating cycles; 6 by default: the fewest whose min-max of per-cycle ratios covers "
                         "the median with >= 95%% confidence (1 - 2^(1-n) = 96.9%%)")
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--c1-requests", type=int, default=3, help="single streams, one after another, per run")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="compute threads, every server")
    ap.add_argument("--zgtool-threads", type=int, default=0, help="override zgtool's thread count only")
    ap.add_argument("--dtype", default="float32", help="float32 | bfloat16 (servers that take a dtype)")
    ap.add_argument("--dtypes", type=parse_dtypes, default=list(VARIANTS),
                    help="same (every engine in --dtype), best (each engine's best dtype), or both: same,best")
    ap.add_argument("--zgtool-best-dtype", default="auto",
                    help="zgtool's best-dtype row: auto (int8 when `zgtool serve --dtype` offers it, else bfloat16)")
    ap.add_argument("--zgtool-rows", type=lambda v: [x for x in v.split(",") if x.strip()], default=["auto", "bf16"],
                    help="zgtool's extra rows: auto (--dtype auto), bf16 (--dtype bfloat16), both (default) or ''")
    ap.add_argument("--keep", action="store_true", help="keep the temporary directory (checkpoints, logs)")
    return ap


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    peers = parse_peers(args.peers)
    # SIGTERM unwinds like Ctrl-C, so the server in flight is stopped by its context manager
    signal.signal(signal.SIGTERM, _interrupt)
    models = [m.strip() for m in (args.models or default_models()).split(",") if m.strip()]
    serve_help = subprocess.run([sys.executable, "-m", "zgtool", "serve", "--help"], capture_output=True,
                                text=True, env={**os.environ, "COLUMNS": "200"}).stdout
    tmp = Path(tempfile.mkdtemp(prefix="zg-peers-"))
    out: dict[str, Any] = {"bench": "peers", "concurrency": args.concurrency, "max_tokens": args.max_tokens,
                           "cycles": args.cycles, "threads": args.threads, "dtype": args.dtype,
                           "dtypes": args.dtypes,
                           "cpus": os.cpu_count(), "cpu": cpu_model(), "cpu_flags": cpu_flags(), "zgtool_rows": args.zgtool_rows,
                           "models": []}
    variants_note = "and each engine's best" if BEST in args.dtypes else "only"
    try:
        print(f"peers: {', '.join(['zgtool', *peers])}; {args.concurrency} streams x {args.max_tokens} tokens and "
              f"{args.c1_requests} x 1 stream; {args.cycles} alternating cycles; {args.threads} threads; "
              f"dtype {args.dtype} ({variants_note}); "
              f"{os.cpu_count()} cpus")
        for m in models:
            case = prepare_model(m, tmp, bool({"llama", "llama-server"} & set(peers)), args.dtype)
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

"""Small x86 SIMD C kernels for the CPU engine: the C source is engine/csrc/ (zg_kernels.h is the ABI),
compiled on first use with the system C compiler into the user cache
(~/.cache/zgtool/kernels/zg_kernels-<hash of sources and flags>/, the sources kept beside the .so
with debug line info; ~1-8 s with gcc) and called through ctypes on tensors' data pointers. No torch headers, so no torch C++ extension
build (minutes on this box). Unavailable (KernelsUnavailable) without a C compiler, AVX2+FMA or
a writable cache, or with ZGTOOL_NO_KERNELS set: fp32 then runs on torch ops alone (the
previous engine) and --dtype int8 fails at load with the reason.

ISA variants (VARIANTS): the same sources built once per instruction set with its own flags,
each its own cache entry: avx2 (8-lane GEMMs), avx512 (16-lane GEMMs), avx512bf16 (bf16 weights
on vdpbf16ps). The best one the CPU's flags allow is chosen once (choose_variant), or the one
ZGTOOL_KERNEL_ISA names; a variant the CPU lacks a flag for is never loaded (KernelsUnavailable
instead of SIGILL). AMX tiles (amx_bf16) are not used: untested, no machine with AMX here.

w8_gemm: y[m, n] = scale[n] * sum_k x[m, k] * w[n, k] (+ bias[n]) with w int8 [N, K] (symmetric
per-output-channel quantization), x/y fp32: weight-only int8, activations never quantized, so
rows never influence each other (each output is the same FMA sequence whatever the batch).
Four rows x two output channels per register block; int8 -> fp32 converted in registers.

paged_decode_attention: one query per sequence attends to its KV read in place through its
block table (no gather into padded buffers, no mask): scores, exact softmax (max-subtracted,
expf), weighted sum of V; one (sequence, head) at a time, so batch-invariant.

add_rms_norm: the residual add and the next RMSNorm in one pass over a row (F.rms_norm on CPU
is a composite of 5-6 ops: ~60-150 us per call at 1-16 rows of 576, ~4 ms of a SmolLM2 token).

silu_mul and rope_kv_write: the glue between the GEMMs of a layer (silu(gate) * up; RoPE on q
and k plus the KV write into the paged pool) as one pass each instead of ~10 torch ops per layer
(SmolLM2 int8 step: -15% at batch 1, -26% at batch 16).

Threads: the GEMMs (split by output channel) and the attention (split by sequence x KV head)
use torch.get_num_threads() threads through a small claim-based pool (parallel_chunks): the
caller posts a job and works through its chunks itself while workers claim the rest, and it
waits only for chunks a worker actually claimed. OpenMP's barrier waits for every thread of the
team instead: with one core taken by another process, a 2-thread SmolLM2 step went from 78 ms
to 600+ ms (torch's own MKL GEMMs show the same: 68 -> 14 GFLOP/s at 2 threads with a
single-core neighbour). Which thread computes an output never changes its arithmetic, so results
are bit-identical for any thread count.
"""
from __future__ import annotations

import ctypes
import functools
import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch

log = logging.getLogger("zgtool.engine.kernels")

CSRC = Path(__file__).parent / "csrc"
HEADER = "zg_kernels.h"
SOURCES = ("pool.c", "gemm.c", "gemm_vnni.c", "attention.c", "glue.c", "step.c")
LIB_NAME = "zg_kernels.so"

# -ffp-contract=off: gcc would otherwise fuse an output's epilogue (sum * scale + bias) into an FMA
# in some inlined copies of the GEMM block and not in others, and a row's result would then
# depend on the register block it landed in (every FMA that matters is an explicit intrinsic).
# -g adds line info only (no code change); -Werror: a warning is a build failure, reported.
# The ISA flags come from the variant (IsaVariant.flags).
FLAGS = ("-O3", "-ffp-contract=off", "-pthread", "-shared", "-fPIC", "-fno-math-errno",
         "-Wall", "-Wextra", "-Werror", "-g")
LIBS = ("-lm",)


@dataclass(frozen=True)
class IsaVariant:
    """One instruction-set build of the kernels: its compiler flags and the CPU flags
    (/proc/cpuinfo, i.e. cpuid as the kernel reports it) a CPU must have for it to be loaded."""

    name: str
    flags: tuple[str, ...]
    cpu_flags: frozenset[str]
    what: str


_AVX2 = ("-mavx2", "-mfma")
_AVX512 = _AVX2 + ("-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512dq")
# best first: the first the CPU supports is chosen (ZGTOOL_KERNEL_ISA forces one)
VARIANTS = (
    IsaVariant("avx512bf16", _AVX512 + ("-mavx512bf16", "-mavx512vnni"),
               frozenset({"avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_bf16", "avx512_vnni"}),
               "16-lane GEMMs, bf16 weights on vdpbf16ps, int8 x int8 on vpdpbusd"),
    IsaVariant("avx512", _AVX512, frozenset({"avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512dq"}),
               "16-lane GEMMs"),
    IsaVariant("avx2", _AVX2, frozenset({"avx2", "fma"}), "8-lane GEMMs"),
)
ISA_ENV = "ZGTOOL_KERNEL_ISA"
# ZGTOOL_KERNEL_SANITIZE=address|thread: an instrumented build (its own cache entry) for
# scripts/sanitize_kernels.sh; the process must preload the sanitizer runtime
SANITIZE_FLAGS = {
    "address": ("-fsanitize=address,undefined", "-fno-sanitize-recover=undefined", "-fno-omit-frame-pointer"),
    "thread": ("-fsanitize=thread", "-fno-omit-frame-pointer"),
}


class KernelsUnavailable(RuntimeError):
    pass


class KernelBuildFailed(KernelsUnavailable):
    """The compiler failed: the message carries its output (also logged)."""


class LayerPtrs(ctypes.Structure):
    """One decoder layer's weights and KV cache for step_layers (layer_ptrs in zg_kernels.h;
    pointers into live tensors: the owner keeps the tensors alive and rebuilds this when the KV
    pool moves)."""

    _fields_ = [(name, ctypes.c_void_p) for name in (
        "input_norm", "post_norm", "qkv", "qkv_scale", "qkv_bias", "o", "o_scale", "gate_up", "gate_up_scale",
        "down", "down_scale", "kc", "vc")]


_P, _I64, _F32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_float

# the projections' weight element (ZG_W_* in zg_kernels.h)
W_F32, W_INT8, W_BF16, W_INT8A8 = 0, 1, 2, 3


class StepArgs(ctypes.Structure):
    """step_layers' one argument (step_args in zg_kernels.h; test_kernel_abi.py checks the fields,
    their order and types against the header)."""

    _fields_ = [
        ("layers", _P), ("nl", _I64), ("wtype", _I64), ("x", _P), ("M", _I64), ("hidden", _I64), ("H", _I64),
        ("KVH", _I64), ("D", _I64), ("inter", _I64), ("eps", _F32), ("final_norm", _P), ("out", _P),
        ("cos_t", _P), ("sin_t", _P), ("positions", _P), ("slots", _P), ("tables", _P), ("width", _I64),
        ("lens", _P), ("bs", _I64), ("scale", _F32), ("h", _P), ("qkv", _P), ("q", _P), ("att", _P), ("gu", _P),
        ("act", _P), ("delta", _P), ("attn_scratch", _P), ("nt", _I64)]
# every exported function of zg_kernels.h: (restype, argtypes); test_kernel_abi.py parses the
# header and checks each prototype against this table (count, order, C type <-> ctypes type)
SIGNATURES: dict[str, tuple[object, list[object]]] = {
    "w8_gemm": (None, [_P, _I64, _I64, _P, _P, _P, _P, _I64, _I64]),
    "f32_gemm": (None, [_P, _I64, _I64, _P, _P, _P, _P, _I64, _I64]),
    "bf16_gemm": (None, [_P, _I64, _I64, _P, _P, _P, _P, _I64, _I64]),
    "kernel_isa": (ctypes.c_char_p, []),
    "w8a8_gemm": (None, [_P, _I64, _I64, _P, _P, _P, _P, _I64, _I64]),
    "w8a8_vnni": (_I64, [_I64]),
    "paged_decode_attention": (None, [_P, _P, _P, _P, _I64, _P, _I64, _I64, _I64, _I64, _I64, _F32, _P, _P, _I64]),
    "add_rms_norm": (None, [_P, _P, _P, _F32, _I64, _I64, _P]),
    "silu_mul": (None, [_P, _I64, _I64, _P]),
    "rope_kv_write": (None, [_P, _I64, _I64, _I64, _I64, _P, _P, _P, _P, _P, _P, _P]),
    "w8_dequant": (None, [_P, _P, _I64, _I64, _P]),
    "step_layers": (None, [_P]),
    "lm_head_argmax": (None, [_P, _I64, _I64, _P, _P, _I64, _P, _I64, _P, _I64]),
    "nonfinite_rows": (_I64, [_P, _I64, _I64, _P]),
    "pool_workers": (_I64, []),
    "pool_counters": (None, [_P, _P, _P, _P, _I64]),
    "pool_reset_counters": (None, []),
    "pool_stop": (None, []),
}


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "zgtool" / "kernels"


def cpu_flags() -> frozenset[str]:
    """The CPU's feature flags as the kernel reports cpuid (/proc/cpuinfo's first "flags" line, read
    once); empty where there is none to read."""
    return _proc_cpu_flags()


@functools.cache
def _proc_cpu_flags() -> frozenset[str]:
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("flags"):
                    return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


def cpu_has_avx2_fma() -> bool:
    return {"avx2", "fma"} <= cpu_flags()


def choose_variant(flags: frozenset[str] | None = None) -> IsaVariant:
    """The ISA variant to load, chosen once from the CPU's flags: the one ZGTOOL_KERNEL_ISA names
    (avx2 | avx512 | avx512bf16), else the best the CPU supports. A variant whose flags the CPU
    lacks is never chosen (loading it could only end in SIGILL): KernelsUnavailable says which."""
    have = cpu_flags() if flags is None else flags
    want = os.environ.get(ISA_ENV, "").strip().lower()
    if want:
        by_name = {v.name: v for v in VARIANTS}
        if want not in by_name:
            raise KernelsUnavailable(f"{ISA_ENV}={want!r}: expected one of {', '.join(by_name)}")
        missing = sorted(by_name[want].cpu_flags - have)
        if missing:
            raise KernelsUnavailable(f"{ISA_ENV}={want}: this CPU lacks {', '.join(missing)}")
        return by_name[want]
    for v in VARIANTS:
        if v.cpu_flags <= have:
            return v
    raise KernelsUnavailable("this CPU lacks AVX2/FMA (needed by the kernels)")


def sanitizer() -> str | None:
    """The sanitizer asked for by ZGTOOL_KERNEL_SANITIZE (address | thread), or None."""
    want = os.environ.get("ZGTOOL_KERNEL_SANITIZE", "").strip().lower()
    if not want:
        return None
    if want not in SANITIZE_FLAGS:
        raise KernelsUnavailable(f"ZGTOOL_KERNEL_SANITIZE={want!r}: expected one of {', '.join(SANITIZE_FLAGS)}")
    return want


def build_flags(variant: IsaVariant | None = None) -> tuple[str, ...]:
    """The compiler flags of a variant's build (the chosen one by default), sanitizer included."""
    san = sanitizer()
    v = variant or choose_variant()
    return FLAGS + v.flags + (SANITIZE_FLAGS[san] if san else ())


def source_files() -> list[Path]:
    """Every file of engine/csrc/ the build reads (the .c files and the headers they include)."""
    return sorted(p for p in CSRC.iterdir() if p.suffix in (".c", ".h"))


def build_key(flags: tuple[str, ...]) -> str:
    """A hash of every source file (name and content) and the flags: the cache entry's name."""
    h = hashlib.sha256()
    for p in source_files():
        h.update(p.name.encode() + b"\0" + p.read_bytes() + b"\0")
    h.update(" ".join(flags + LIBS).encode())
    return h.hexdigest()[:16]


def library() -> ctypes.CDLL:
    """The compiled kernels of the chosen ISA variant (built on first use; concurrent builders each
    build in a temp directory and rename it into place, so a reader never sees half a library).
    ZGTOOL_NO_KERNELS and ZGTOOL_KERNEL_ISA are read on every call, so a model built after one is
    set runs accordingly even when another library is loaded."""
    if os.environ.get("ZGTOOL_NO_KERNELS"):
        raise KernelsUnavailable("disabled by ZGTOOL_NO_KERNELS")
    v = choose_variant()
    return _built_library(v, build_flags(v))


def isa() -> str | None:
    """The loaded variant's name as the library itself reports it (kernel_isa()), None when off."""
    try:
        return library().kernel_isa().decode()
    except KernelsUnavailable:
        return None


def status(device: str = "cpu") -> str:
    """The kernels' state as one value: "on", or "off: <reason>" (no compiler, "build failed"
    with the compiler's first line, ZGTOOL_NO_KERNELS, a CPU without AVX2/FMA, a CUDA device)."""
    if not str(device).startswith("cpu"):
        return f"off: {device} device (the kernels are CPU-only)"
    try:
        library()
    except KernelsUnavailable as exc:
        return f"off: {str(exc).splitlines()[0]}"
    return "on"


def choice_status(device: str, dtype: str | None) -> str:
    """status() for an engine not loaded yet (verify's environment: the server it starts): the
    device and dtype it will run with, and whether the library builds here."""
    if dtype not in (None, "float32", "int8", "bfloat16") and str(device).startswith("cpu"):
        return f"off: dtype {dtype} (the kernels compute with fp32, bf16 or int8 weights)"
    return status(device)


def engine_status(engine: object) -> str:
    """What an Engine computes with, for its banner, results and /metrics: "on", "off: <reason>"
    (the library's reason, a CUDA device, an fp16 model, the null backend), or "partial: <kernel>
    (<reason>), ..." when the model's plan (engine/backends.py KernelPlan, chosen at load) leaves
    some kernels to torch for its shape."""
    model = getattr(engine, "model", None)
    if model is None:
        return "off: no model (null backend)"
    plan = getattr(model, "plan", None)
    if plan is None:
        device = str(getattr(model, "device", "cpu"))
        dtype = getattr(model, "dtype", torch.float32)
        if device.startswith("cpu") and dtype != torch.float32:
            return f"off: dtype {str(dtype).removeprefix('torch.')} (the kernels compute with fp32, bf16 or int8 weights)"
        return status(device)
    if plan.library_off:
        return f"off: {plan.library_off}"
    parts = [f"{k} ({why})" for k in ("gemm", "attention", "norm", "glue") if (why := getattr(plan, f"{k}_off", None))]
    if len(parts) == 4:
        return f"off: {plan.gemm_off}"
    return "partial: torch for " + ", ".join(parts) if parts else "on"


def engine_isa(engine: object) -> str | None:
    """The ISA variant an Engine's kernels run (for the banner, generate --json, /metrics), None
    when its kernels are off."""
    model = getattr(engine, "model", None)
    plan = getattr(model, "plan", None)
    if plan is None or plan.library_off:
        return None
    return getattr(plan, "isa", None)


def compile_kernels(cc: str, flags: tuple[str, ...], out_dir: Path) -> Path:
    """Builds engine/csrc/ into out_dir/zg_kernels-<key>/ (sources, build.log and the .so side by
    side) unless it is there; returns the .so. Raises KernelBuildFailed ("build failed ...") with
    the compiler's output on a failure, which is also logged."""
    key = build_key(flags)
    final = out_dir / f"zg_kernels-{key}"
    so = final / LIB_NAME
    if so.exists():
        return so
    out_dir.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".build-", dir=out_dir))
    try:
        for p in source_files():
            shutil.copy2(p, tmp / p.name)
        cmd = [cc, *flags, f"-fdebug-prefix-map={tmp}={final}", *SOURCES, "-o", LIB_NAME, *LIBS]
        res = subprocess.run(cmd, cwd=tmp, capture_output=True, text=True, timeout=300)
        (tmp / "build.log").write_text(" ".join(cmd) + "\n" + res.stdout + res.stderr)
        if res.returncode != 0:
            said = (res.stdout + res.stderr)[-4000:]
            log.warning("building the CPU kernels failed: %s\n%s", " ".join(cmd), said)
            raise KernelBuildFailed(f"build failed ({cc} exit {res.returncode}; the compiler's message is in "
                                    f"the log)\n{said}")
        try:
            os.rename(tmp, final)
        except OSError:
            if not so.exists():  # not a concurrent builder's finished copy
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return so


@functools.cache
def _built_library(variant: IsaVariant, flags: tuple[str, ...]) -> ctypes.CDLL:
    missing = variant.cpu_flags - cpu_flags()
    if missing:  # the last guard before dlopen: a variant the CPU lacks is never loaded
        raise KernelsUnavailable(f"the {variant.name} kernels need {', '.join(sorted(missing))}, which this CPU lacks")
    cc = os.environ.get("CC") or shutil.which("gcc") or shutil.which("cc")
    if not cc:
        raise KernelsUnavailable("no C compiler (gcc/cc) found to build the kernels")
    try:
        so = compile_kernels(cc, flags, cache_dir())
        lib = ctypes.CDLL(str(so))
    except (OSError, subprocess.SubprocessError) as exc:
        raise KernelsUnavailable(f"cannot build or load the CPU kernels in {cache_dir()}: {exc}") from exc
    for name, (restype, argtypes) in SIGNATURES.items():
        fn = getattr(lib, name)
        fn.argtypes = argtypes
        fn.restype = restype
    return lib


class KernelArgumentError(ValueError):
    """A tensor a kernel cannot take (dtype, shape, layout): raised before any pointer is passed."""


def _need(kernel: str, name: str, t: torch.Tensor, dtype: torch.dtype, shape: tuple[int | None, ...],
          contiguous: bool = True) -> None:
    """t must be a CPU tensor of `dtype` and `shape` (None: any size on that axis), contiguous
    unless told otherwise: the C side reads it as a dense array, so anything else would read the
    wrong memory (an int32 lens tensor read as int64 crashed the process)."""
    ok = isinstance(t, torch.Tensor) and t.dtype == dtype and not t.is_cuda and (t.is_contiguous() or not contiguous)
    if ok:
        have = t.shape
        ok = len(have) == len(shape)
        if ok:
            for i, want in enumerate(shape):
                if want is not None and have[i] != want:
                    ok = False
                    break
    if not ok:
        got = (f"{tuple(t.shape)} {t.dtype} on {t.device}{'' if t.is_contiguous() else ' non-contiguous'}"
               if isinstance(t, torch.Tensor) else type(t).__name__)
        want_shape = "[" + ", ".join("*" if d is None else str(d) for d in shape) + "]"
        raise KernelArgumentError(f"{kernel}: {name} must be a {'contiguous ' if contiguous else ''}{dtype} "
                                  f"CPU tensor {want_shape}, got {got}")


def _dense(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous()


def w8_gemm(x: torch.Tensor, w: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x [M, K] fp32 times int8 w [N, K] with fp32 scale [N] (+ bias [N]) -> [M, N] fp32. K % 8 == 0."""
    _need("w8_gemm", "x", x, torch.float32, (None, None), contiguous=False)
    m, k = x.shape
    _need("w8_gemm", "w", w, torch.int8, (None, k))
    n = w.shape[0]
    _need("w8_gemm", "scale", scale, torch.float32, (n,))
    if bias is not None:
        _need("w8_gemm", "bias", bias, torch.float32, (n,))
    if k % 8:
        raise KernelArgumentError(f"w8_gemm: K={k} (K % 8 == 0 needed)")
    x = _dense(x)
    y = torch.empty(m, n, dtype=torch.float32)
    library().w8_gemm(x.data_ptr(), m, k, w.data_ptr(), scale.data_ptr(),
                      None if bias is None else bias.data_ptr(), y.data_ptr(), n, torch.get_num_threads())
    return y


def paged_decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, tables: torch.Tensor,
                           lens: torch.Tensor, block_size: int, scale: float,
                           out: torch.Tensor | None = None) -> torch.Tensor:
    """q [B, H, D] (one query per sequence), caches [slots, KVH, D] fp32, tables [B, width] int64
    block ids (padding never read past lens), lens [B] int64 -> [B, H, D] fp32. D % 8 == 0, H % KVH == 0
    (checked); every len <= width * block_size and every block id below slots / block_size (the
    caller's invariants, not checked: a pass over the values would cost more than the kernel)."""
    name = "paged_decode_attention"
    _need(name, "q", q, torch.float32, (None, None, None), contiguous=False)
    b, h, d = q.shape
    _need(name, "k_cache", k_cache, torch.float32, (None, None, d))
    kvh = k_cache.shape[1]
    _need(name, "v_cache", v_cache, torch.float32, tuple(k_cache.shape))
    _need(name, "tables", tables, torch.int64, (b, None), contiguous=False)
    _need(name, "lens", lens, torch.int64, (b,))
    if out is not None:
        _need(name, "out", out, torch.float32, (b, h, d))
    if d % 8 or kvh < 1 or h % kvh:
        raise KernelArgumentError(f"{name}: head_dim {d} (multiple of 8 needed), {h} heads over {kvh} KV heads")
    width = int(tables.shape[1])
    q = _dense(q)
    tables = _dense(tables)
    if out is None:
        out = torch.empty(b, h, d, dtype=torch.float32)
    nt = torch.get_num_threads()
    scratch = torch.empty(max(1, nt * h // kvh * width * block_size), dtype=torch.float32)
    library().paged_decode_attention(q.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr(), tables.data_ptr(),
                                     width, lens.data_ptr(), b, h, kvh, d, block_size, scale,
                                     out.data_ptr(), scratch.data_ptr(), nt)
    return out


def add_rms_norm(x: torch.Tensor, delta: torch.Tensor | None, w: torch.Tensor, eps: float) -> torch.Tensor:
    """x [rows, n] fp32 contiguous: x += delta in place (if given), then returns rms_norm(x) * w
    as a new tensor. n must be a multiple of 8."""
    _need("add_rms_norm", "x", x, torch.float32, (None, None))
    rows, n = x.shape
    _need("add_rms_norm", "w", w, torch.float32, (n,))
    if delta is not None:
        _need("add_rms_norm", "delta", delta, torch.float32, (rows, n), contiguous=False)
        delta = _dense(delta)
    if n % 8:
        raise KernelArgumentError(f"add_rms_norm: n={n} is not a multiple of 8")
    out = torch.empty_like(x)
    library().add_rms_norm(x.data_ptr(), None if delta is None else delta.data_ptr(), w.data_ptr(), eps, rows, n,
                           out.data_ptr())
    return out


def w8_dequant(w: torch.Tensor, scale: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """out [N, K] fp32 contiguous <- w int8 [N, K] * scale[:, None]. K % 8 == 0."""
    _need("w8_dequant", "w", w, torch.int8, (None, None))
    n, k = w.shape
    _need("w8_dequant", "scale", scale, torch.float32, (n,))
    _need("w8_dequant", "out", out, torch.float32, (n, k))
    if k % 8:
        raise KernelArgumentError(f"w8_dequant: K={k} (K % 8 == 0 needed)")
    library().w8_dequant(w.data_ptr(), scale.data_ptr(), n, k, out.data_ptr())
    return out


def f32_gemm(x: torch.Tensor, w: torch.Tensor, ones: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x [M, K] times fp32 w [N, K] (+ bias [N]; rows never mix) -> [M, N]; `ones` is a tensor of
    at least N 1.0s (the kernel's per-channel scale). K % 8 == 0."""
    _need("f32_gemm", "x", x, torch.float32, (None, None), contiguous=False)
    m, k = x.shape
    _need("f32_gemm", "w", w, torch.float32, (None, k))
    n = w.shape[0]
    _need("f32_gemm", "ones", ones, torch.float32, (None,))
    if bias is not None:
        _need("f32_gemm", "bias", bias, torch.float32, (n,))
    if k % 8 or ones.numel() < n:
        raise KernelArgumentError(f"f32_gemm: K={k} (K % 8 == 0 needed), {ones.numel()} scales for N={n}")
    x = _dense(x)
    y = torch.empty(m, n, dtype=torch.float32)
    library().f32_gemm(x.data_ptr(), m, k, w.data_ptr(), ones.data_ptr(), None if bias is None else bias.data_ptr(),
                       y.data_ptr(), n, torch.get_num_threads())
    return y


def w8a8_gemm(x: torch.Tensor, w: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x [M, K] fp32, quantised per row to int8 on the fly, times int8 w [N, K] with fp32 scale [N]
    (+ bias) -> [M, N] fp32 (lossy: engine/quant.py's int8 with activations quantised too).
    vpdpbusd where the variant has AVX512-VNNI and K % 64 == 0, else the same products in fp32."""
    _need("w8a8_gemm", "x", x, torch.float32, (None, None), contiguous=False)
    m, k = x.shape
    _need("w8a8_gemm", "w", w, torch.int8, (None, k))
    n = w.shape[0]
    _need("w8a8_gemm", "scale", scale, torch.float32, (n,))
    if bias is not None:
        _need("w8a8_gemm", "bias", bias, torch.float32, (n,))
    if k % 8:
        raise KernelArgumentError(f"w8a8_gemm: K={k} (K % 8 == 0 needed)")
    x = _dense(x)
    y = torch.empty(m, n, dtype=torch.float32)
    library().w8a8_gemm(x.data_ptr(), m, k, w.data_ptr(), scale.data_ptr(), None if bias is None else bias.data_ptr(),
                        y.data_ptr(), n, torch.get_num_threads())
    return y


def bf16_gemm(x: torch.Tensor, w: torch.Tensor, ones: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x [M, K] fp32 times bf16 w [N, K] (+ bias [N]; rows never mix) -> [M, N] fp32, fp32
    accumulation; `ones` is a tensor of at least N 1.0s (the kernel's per-channel scale). K % 8 == 0.
    The avx2/avx512 variants widen each weight to fp32 exactly (x stays fp32); avx512bf16 rounds x
    to bf16 in registers for vdpbf16ps when K % 32 == 0."""
    _need("bf16_gemm", "x", x, torch.float32, (None, None), contiguous=False)
    m, k = x.shape
    _need("bf16_gemm", "w", w, torch.bfloat16, (None, k))
    n = w.shape[0]
    _need("bf16_gemm", "ones", ones, torch.float32, (None,))
    if bias is not None:
        _need("bf16_gemm", "bias", bias, torch.float32, (n,))
    if k % 8 or ones.numel() < n:
        raise KernelArgumentError(f"bf16_gemm: K={k} (K % 8 == 0 needed), {ones.numel()} scales for N={n}")
    x = _dense(x)
    y = torch.empty(m, n, dtype=torch.float32)
    library().bf16_gemm(x.data_ptr(), m, k, w.data_ptr(), ones.data_ptr(), None if bias is None else bias.data_ptr(),
                        y.data_ptr(), n, torch.get_num_threads())
    return y


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """gate_up [rows, 2I] fp32 contiguous (gate | up) -> silu(gate) * up [rows, I]. I % 8 == 0."""
    _need("silu_mul", "gate_up", gate_up, torch.float32, (None, None))
    rows, two_i = gate_up.shape
    if two_i % 16:
        raise KernelArgumentError(f"silu_mul: 2I={two_i} (I % 8 == 0 needed)")
    out = torch.empty(rows, two_i // 2, dtype=torch.float32)
    library().silu_mul(gate_up.data_ptr(), rows, two_i // 2, out.data_ptr())
    return out


def rope_kv_write(qkv: torch.Tensor, heads: int, kv_heads: int, cos: torch.Tensor, sin_signed: torch.Tensor,
                  positions: torch.Tensor, slots: torch.Tensor, k_cache: torch.Tensor,
                  v_cache: torch.Tensor) -> torch.Tensor:
    """qkv [T, (H + 2 KVH) * D] fp32 -> q rotated [T, H, D]; k (rotated) and v go into their
    slots of the caches [slots, KVH, D]. cos/sin_signed [P, D]; positions/slots [T] int64 (every
    position below P and slot below the caches' slots: the caller's invariants, not checked)."""
    name = "rope_kv_write"
    _need(name, "k_cache", k_cache, torch.float32, (None, kv_heads, None))
    d = k_cache.shape[2]
    _need(name, "v_cache", v_cache, torch.float32, tuple(k_cache.shape))
    _need(name, "qkv", qkv, torch.float32, (None, (heads + 2 * kv_heads) * d), contiguous=False)
    t = qkv.shape[0]
    _need(name, "cos", cos, torch.float32, (None, d))
    _need(name, "sin_signed", sin_signed, torch.float32, tuple(cos.shape))
    _need(name, "positions", positions, torch.int64, (t,))
    _need(name, "slots", slots, torch.int64, (t,))
    if d % 2:
        raise KernelArgumentError(f"{name}: head_dim {d} is odd")
    qkv = _dense(qkv)
    q = torch.empty(t, heads, d, dtype=torch.float32)
    library().rope_kv_write(qkv.data_ptr(), t, heads, kv_heads, d, cos.data_ptr(), sin_signed.data_ptr(),
                            positions.data_ptr(), slots.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr(),
                            q.data_ptr())
    return q


def nonfinite_rows(x: torch.Tensor) -> list[int]:
    """The rows of x [M, N] fp32 holding a NaN or an infinity, in one C pass (torch.isfinite(x).all(-1)
    over SmolLM2's 49152 logits opens an OpenMP region: 75 ms a step on a loaded 2-core box,
    beside the pool's spinning workers)."""
    _need("nonfinite_rows", "x", x, torch.float32, (None, None))
    m, n = x.shape
    rows = torch.empty(max(1, m), dtype=torch.int64)
    count = library().nonfinite_rows(x.data_ptr(), m, n, rows.data_ptr())
    return [int(r) for r in rows[:count]]


def pool_counters(threads: int) -> tuple[list[int], list[int]]:
    """The pool's per-thread counters since the last reset, thread 0 being the caller: chunks run
    and jobs in which the thread ran at least one chunk."""
    chunks, jobs, _ = pool_counters_shared(threads)
    return chunks, jobs


def pool_counters_shared(threads: int) -> tuple[list[int], list[int], list[int]]:
    """pool_counters, and per worker the jobs it ran on the CPU its caller posted them from (a
    worker stacked on its caller's core adds no compute)."""
    counts = pool_counters_all(threads)
    return counts["chunks"], counts["jobs"], counts["shared"]


def pool_counters_all(threads: int) -> dict[str, list[int]]:
    """Every per-thread counter of the pool since the last reset (engine/csrc/pool.c): chunks,
    jobs, shared (jobs run on the caller's CPU) and moved (jobs at whose start the worker found
    itself on the caller's CPU and moved off it)."""
    out = torch.zeros(4, threads, dtype=torch.int64)
    library().pool_counters(out[0].data_ptr(), out[1].data_ptr(), out[2].data_ptr(), out[3].data_ptr(), threads)
    return {name: [int(v) for v in row] for name, row in zip(("chunks", "jobs", "shared", "moved"), out, strict=True)}

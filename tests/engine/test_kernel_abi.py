"""The ctypes binding agrees with the C ABI (engine/csrc/zg_kernels.h): every exported prototype
has a ctypes signature with the same argument count, order and types, and LayerPtrs has
layer_ptrs' fields in order; the built library exports every function of the header."""

from __future__ import annotations

import ctypes
import re

import pytest

from zgtool.engine import cpu_kernels as ck

C_TO_CTYPES = {"int64_t": ctypes.c_int64, "float": ctypes.c_float, "int": ctypes.c_int, "void": None}


def _header() -> str:
    text = (ck.CSRC / ck.HEADER).read_text()
    return re.sub(r"/\*.*?\*/", " ", text, flags=re.S)


def _ctype(decl: str) -> object:
    """'const float *x' -> c_void_p, 'int64_t M' -> c_int64 (every pointer is passed as c_void_p)."""
    decl = " ".join(decl.replace("*", " * ").split())
    if "*" in decl:
        return ctypes.c_void_p
    words = [w for w in decl.split() if w not in ("const", "volatile")]
    return C_TO_CTYPES[words[0]]


def prototypes() -> dict[str, tuple[object, list[object]]]:
    found: dict[str, tuple[object, list[object]]] = {}
    for ret, name, params in re.findall(r"^\s*([A-Za-z_][\w ]*?\**)\s*\b(\w+)\(([^)]*)\);", _header(), flags=re.M):
        args = [] if params.strip() in ("", "void") else [_ctype(p) for p in params.split(",")]
        found[name] = (_ctype(ret + " r"), args)
    return found


def test_header_declares_the_kernels_the_engine_calls() -> None:
    assert {"w8_gemm", "f32_gemm", "paged_decode_attention", "add_rms_norm", "silu_mul", "rope_kv_write",
            "w8_dequant", "step_layers", "lm_head_argmax", "pool_counters"} <= set(prototypes())


def test_every_prototype_has_a_ctypes_signature_and_no_more() -> None:
    assert set(prototypes()) == set(ck.SIGNATURES)


@pytest.mark.parametrize("name", sorted(ck.SIGNATURES))
def test_ctypes_signature_matches_the_header(name: str) -> None:
    want_ret, want_args = prototypes()[name]
    ret, args = ck.SIGNATURES[name]
    assert ret is want_ret, f"{name}: restype {ret} vs header {want_ret}"
    assert len(args) == len(want_args), f"{name}: {len(args)} argtypes vs {len(want_args)} in the header"
    for i, (have, want) in enumerate(zip(args, want_args, strict=True)):
        assert have is want, f"{name} argument {i}: ctypes {have} vs header {want}"


def test_layer_ptrs_fields_match_the_struct() -> None:
    body = re.search(r"typedef struct \{(.*?)\} layer_ptrs;", _header(), flags=re.S)
    assert body is not None
    # 'const float *input_norm, *post_norm' -> input_norm, post_norm
    fields = [part.split()[-1].lstrip("*") for decl in body.group(1).split(";") if decl.strip()
              for part in decl.split(",")]
    assert fields == [f[0] for f in ck.LayerPtrs._fields_]
    assert all(f[1] is ctypes.c_void_p for f in ck.LayerPtrs._fields_)


@pytest.mark.skipif(not ck.cpu_has_avx2_fma(), reason="the kernels need AVX2 + FMA")
def test_built_library_exports_every_header_function() -> None:
    lib = ck.library()
    for name in prototypes():
        fn = getattr(lib, name)
        assert fn.argtypes == ck.SIGNATURES[name][1]

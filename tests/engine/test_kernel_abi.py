"""The ctypes binding agrees with the C ABI (engine/csrc/zg_kernels.h): every exported prototype
has a ctypes signature with the same argument count, order and types, LayerPtrs and StepArgs have
layer_ptrs' and step_args' fields in order with the same types, the weight-element constants
agree, and the built library (every ISA variant this CPU runs) exports every function of the
header."""

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
        return ctypes.c_char_p if decl.split()[-3:-1] == ["char", "*"] else ctypes.c_void_p
    words = [w for w in decl.split() if w not in ("const", "volatile")]
    return C_TO_CTYPES[words[0]]


def prototypes() -> dict[str, tuple[object, list[object]]]:
    found: dict[str, tuple[object, list[object]]] = {}
    for ret, name, params in re.findall(r"^\s*([A-Za-z_][\w ]*?\**)\s*\b(\w+)\(([^)]*)\);", _header(), flags=re.M):
        args = [] if params.strip() in ("", "void") else [_ctype(p) for p in params.split(",")]
        found[name] = (_ctype(ret + " r"), args)
    return found


def test_header_declares_the_kernels_the_engine_calls() -> None:
    assert {"w8_gemm", "f32_gemm", "bf16_gemm", "kernel_isa", "paged_decode_attention", "add_rms_norm", "silu_mul", "rope_kv_write",
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


def struct_fields(name: str) -> list[tuple[str, object]]:
    """A typedef'd struct's fields in order with their ctypes types:
    'const float *input_norm, *post_norm' -> (input_norm, c_void_p), (post_norm, c_void_p)."""
    body = re.search(r"typedef struct \{([^}]*)\} " + name + ";", _header(), flags=re.S)
    assert body is not None, name
    fields = []
    for decl in (d.strip() for d in body.group(1).split(";") if d.strip()):
        first, *rest = decl.split(",")
        base = " ".join(w for w in first.replace("*", " * ").split()[:-1] if w != "*")
        for part in (first, *rest):
            part = part.replace("*", " * ").split()
            fields.append((part[-1], ctypes.c_void_p if "*" in part else _ctype(base + " v")))
    return fields


@pytest.mark.parametrize("struct, binding", [("layer_ptrs", ck.LayerPtrs), ("step_args", ck.StepArgs)])
def test_struct_fields_match_the_header(struct: str, binding: type[ctypes.Structure]) -> None:
    assert struct_fields(struct) == list(binding._fields_)


def test_weight_element_constants_match_the_header() -> None:
    found = dict(re.findall(r"#define ZG_W_(\w+) (\d+)", _header()))
    assert {k: int(v) for k, v in found.items()} == {"F32": ck.W_F32, "INT8": ck.W_INT8, "BF16": ck.W_BF16,
                                                     "INT8A8": ck.W_INT8A8}


RUNNABLE = [v.name for v in ck.VARIANTS if v.cpu_flags <= ck.cpu_flags()]


@pytest.mark.skipif(not RUNNABLE, reason="the kernels need AVX2 + FMA")
@pytest.mark.parametrize("isa", RUNNABLE)
def test_built_library_exports_every_header_function(isa: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ck.ISA_ENV, isa)
    lib = ck.library()
    assert lib.kernel_isa().decode() == isa
    for name in prototypes():
        fn = getattr(lib, name)
        assert fn.argtypes == ck.SIGNATURES[name][1]

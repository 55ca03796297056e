"""The kernels' ISA variants (engine/cpu_kernels.py VARIANTS): the best one the CPU's flags allow is
chosen once, ZGTOOL_KERNEL_ISA forces one, and a variant whose flags the CPU lacks is never loaded
(it could only end in SIGILL); a CPU without AVX2 runs the torch path with the reason; a failed
build says "off: build failed" with the compiler's message in the log while the engine still
serves; every variant this CPU executes computes the GEMMs of every weight type correctly."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from zgtool.engine import Engine, EngineConfig, SamplingParams
from zgtool.engine import cpu_kernels as ck

RUNNABLE = [v.name for v in ck.VARIANTS if v.cpu_flags <= ck.cpu_flags()]
AVX2_ONLY = frozenset({"sse2", "avx", "avx2", "fma"})
ALL512 = AVX2_ONLY | {"avx512f", "avx512bw", "avx512vl", "avx512dq"}


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ck.ISA_ENV, raising=False)
    monkeypatch.delenv("ZGTOOL_NO_KERNELS", raising=False)


def test_the_best_variant_the_flags_allow_is_chosen() -> None:
    assert ck.choose_variant(AVX2_ONLY).name == "avx2"
    assert ck.choose_variant(ALL512).name == "avx512"
    assert ck.choose_variant(ALL512 | {"avx512_bf16"}).name == "avx512"  # vpdpbusd too: needs avx512_vnni
    assert ck.choose_variant(ALL512 | {"avx512_bf16", "avx512_vnni"}).name == "avx512bf16"
    with pytest.raises(ck.KernelsUnavailable, match="lacks AVX2/FMA"):
        ck.choose_variant(frozenset({"sse2", "avx"}))


def test_a_forced_variant_the_cpu_lacks_is_refused_with_the_missing_flags(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ck.ISA_ENV, "avx512bf16")
    with pytest.raises(ck.KernelsUnavailable, match="ZGTOOL_KERNEL_ISA=avx512bf16: this CPU lacks avx512_bf16"):
        ck.choose_variant(ALL512)
    monkeypatch.setenv(ck.ISA_ENV, "avx2")
    assert ck.choose_variant(ALL512 | {"avx512_bf16", "avx512_vnni"}).name == "avx2"  # a lesser one may be forced
    monkeypatch.setenv(ck.ISA_ENV, "sse9")
    with pytest.raises(ck.KernelsUnavailable, match="expected one of avx512bf16, avx512, avx2"):
        ck.choose_variant(ALL512)


# run in a fresh process: the CPU's flags are replaced by an AVX2-only set, and the test reads
# /proc/self/maps to see which kernel libraries the process mapped
_NEVER_LOADED = """
import json, os, sys
from zgtool.engine import cpu_kernels as ck
ck.cpu_flags = lambda: frozenset({"sse2", "avx", "avx2", "fma"})
out = {"status": ck.status()}
try:
    ck._built_library(ck.VARIANTS[0], ck.build_flags(ck.VARIANTS[0]))
except ck.KernelsUnavailable as exc:
    out["direct"] = str(exc)
out["maps"] = [l.split()[-1] for l in open("/proc/self/maps") if "zg_kernels" in l]
print(json.dumps(out))
"""


@pytest.mark.skipif(not RUNNABLE, reason="the kernels need AVX2 + FMA")
@pytest.mark.parametrize("forced", ["avx512", "avx512bf16"])
def test_a_variant_is_never_loaded_on_a_cpu_lacking_its_flags(forced: str, tmp_path: Path) -> None:
    env = {**os.environ, ck.ISA_ENV: forced}
    res = subprocess.run([sys.executable, "-c", _NEVER_LOADED], capture_output=True, text=True, env=env, timeout=120)
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout.strip().splitlines()[-1])
    assert out["status"].startswith(f"off: ZGTOOL_KERNEL_ISA={forced}: this CPU lacks avx512")
    assert out["direct"].startswith("the avx512bf16 kernels need avx512_bf16, avx512_vnni, avx512bw")  # the guard before dlopen
    assert out["maps"] == []  # no kernel library was mapped into the process


def test_a_cpu_without_avx2_runs_fp32_on_torch_and_says_why(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ck, "cpu_flags", lambda: frozenset({"sse2", "avx"}))
    ck._built_library.cache_clear()
    try:
        e = Engine(EngineConfig(model="dummy:tiny", dtype="float32", device="cpu"))
        assert e.model is not None
        assert e.model.backend_name == "torch: this CPU lacks AVX2/FMA (needed by the kernels)"
        assert ck.engine_status(e) == "off: this CPU lacks AVX2/FMA (needed by the kernels)"
        assert ck.engine_isa(e) is None
        out = e.generate([256, 5, 6], SamplingParams(max_tokens=3, temperature=0))
        assert len(out.output_token_ids) == 3
    finally:
        ck._built_library.cache_clear()


def close(got: torch.Tensor, want: torch.Tensor) -> None:
    """fp32 sums in another order: within 1e-5 of the outputs' magnitude"""
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5 * want.abs().max().item())


@pytest.mark.skipif(not RUNNABLE, reason="the kernels need AVX2 + FMA")
@pytest.mark.parametrize("isa", RUNNABLE)
def test_every_variant_this_cpu_runs_computes_each_weight_type(isa: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ck.ISA_ENV, isa)
    assert ck.isa() == isa
    g = torch.Generator().manual_seed(0)
    for k in (8, 24, 48, 576):  # every instance: 8-lane tails, 16-lane, 32-pair vdpbf16ps
        x, w = torch.randn(5, k, generator=g), torch.randn(67, k, generator=g)
        ones, bias = torch.ones(67), torch.randn(67, generator=g)
        close(ck.f32_gemm(x, w, ones, bias), x @ w.t() + bias)
        wb = w.bfloat16()
        ref = x @ wb.float().t() + bias
        # the vdpbf16ps instance rounds x to bf16 (K % 32 == 0): within bf16's rounding of x
        exact = not (isa == "avx512bf16" and k % 32 == 0)
        ref_x = ref if exact else x.bfloat16().float() @ wb.float().t() + bias
        close(ck.bf16_gemm(x, wb, ones, bias), ref_x)
        assert (ck.bf16_gemm(x, wb, ones, bias) - ref).abs().max().item() < 0.02 * ref.abs().max().item()
        q = torch.randint(-127, 128, (67, k), dtype=torch.int8, generator=g)
        scale = torch.rand(67, generator=g)
        close(ck.w8_gemm(x, q, scale), (x @ q.float().t()) * scale)
        # rows never mix: one row alone gives the same bits as in the batch
        assert torch.equal(ck.bf16_gemm(x[2:3], wb, ones, bias)[0], ck.bf16_gemm(x, wb, ones, bias)[2])


@pytest.mark.skipif(not RUNNABLE, reason="the kernels need AVX2 + FMA")
@pytest.mark.parametrize("isa", RUNNABLE)
def test_the_engine_names_the_variant_it_runs(isa: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ck.ISA_ENV, isa)
    for dtype in ("float32", "bfloat16"):
        e = Engine(EngineConfig(model="dummy:tiny", dtype=dtype, device="cpu"))
        assert ck.engine_status(e) == "on" and ck.engine_isa(e) == isa
        assert e.model is not None and e.model.backend_name == "c-kernels"


def test_a_failed_build_is_off_build_failed_with_the_message_logged_and_the_engine_serves(
        tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    cc = tmp_path / "cc"
    cc.write_text("#!/bin/sh\necho 'gemm.c:1: error: what the compiler said' >&2\nexit 1\n")
    cc.chmod(0o755)
    monkeypatch.setenv("CC", str(cc))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    ck._built_library.cache_clear()
    try:
        with caplog.at_level("WARNING", logger="zgtool.engine.kernels"):
            state = ck.status()
        assert state.startswith("off: build failed")
        assert "what the compiler said" in caplog.text
        e = Engine(EngineConfig(model="dummy:tiny", dtype="float32", device="cpu"))
        assert ck.engine_status(e).startswith("off: build failed")
        assert len(e.generate([256, 5], SamplingParams(max_tokens=2, temperature=0)).output_token_ids) == 2
    finally:
        ck._built_library.cache_clear()


def test_auto_dtype_on_cpu_is_bf16_exactly_where_the_kernels_run(monkeypatch: pytest.MonkeyPatch) -> None:
    from zgtool.engine import config as c

    monkeypatch.setattr(ck, "status", lambda device="cpu": "on")
    assert c.resolve_dtype("auto", "cpu") == "bfloat16" and c.resolve_dtype("auto", "cuda:0") == "bfloat16"
    assert c.auto_cpu_dtype()[1].startswith("auto: bf16 weights on the C kernels (SmolLM2 c=1 decode bf16/fp32 ")
    monkeypatch.setattr(ck, "status", lambda device="cpu": "off: this CPU lacks AVX2/FMA (needed by the kernels)")
    assert c.resolve_dtype("auto", "cpu") == "float32"
    assert "off: this CPU lacks AVX2/FMA" in c.auto_cpu_dtype()[1]
    assert c.resolve_dtype("bfloat16", "cpu") == "bfloat16"  # asked for, it is what runs


@pytest.mark.skipif(not RUNNABLE, reason="the kernels need AVX2 + FMA")
def test_an_auto_engine_runs_bf16_weights_on_the_kernels_and_float32_without_them(
        monkeypatch: pytest.MonkeyPatch) -> None:
    e = Engine(EngineConfig(model="dummy:tiny", device="cpu"))
    assert e.dtype == "bfloat16" and e.model is not None and e.model.backend_name == "c-kernels"
    assert e.model.backends["linear"] == "c-bf16-gemm"
    monkeypatch.setenv("ZGTOOL_NO_KERNELS", "1")
    e = Engine(EngineConfig(model="dummy:tiny", device="cpu"))
    assert e.dtype == "float32" and e.model is not None  # never bf16 on torch alone

"""The kernels' state is one value, "on" or "off: <reason>", and every place that shows a figure
says it: generate's result (text and --json), the served /metrics, verify's environment."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from zgtest import run_zgtool

from zgtool.engine import cpu_kernels as ck

needs_avx2 = pytest.mark.skipif(not ck.cpu_has_avx2_fma(), reason="the kernels need AVX2 + FMA")


def _generate_json(env: dict[str, str]) -> dict[str, object]:
    res = run_zgtool("generate", "--model", "dummy:tiny", "--dtype", "float32", "--max-tokens", "2", "--json", env=env, timeout_s=300)
    assert res.returncode == 0, res.stderr
    data = json.loads(res.stdout.strip().splitlines()[-1])
    return data.get("data", data)


def test_generate_json_says_off_with_the_reason_when_disabled() -> None:
    assert _generate_json({"ZGTOOL_NO_KERNELS": "1"})["kernels"] == "off: disabled by ZGTOOL_NO_KERNELS"


@needs_avx2
def test_generate_json_says_on_when_the_kernels_run_and_names_the_variant() -> None:
    data = _generate_json({})
    assert data["kernels"] == "on" and data["kernel_isa"] == ck.isa()
    forced = _generate_json({ck.ISA_ENV: "avx2"})
    assert (forced["kernels"], forced["kernel_isa"]) == ("on", "avx2")
    assert _generate_json({"ZGTOOL_NO_KERNELS": "1"})["kernel_isa"] is None


def test_generate_text_names_the_state() -> None:
    res = run_zgtool("generate", "--model", "dummy:tiny", "--dtype", "float32", "--max-tokens", "2", env={"ZGTOOL_NO_KERNELS": "1"},
                     timeout_s=300)
    assert res.returncode == 0, res.stderr
    assert "kernels off: disabled by ZGTOOL_NO_KERNELS" in " ".join(res.stderr.split())


def test_status_names_a_cuda_device_and_an_fp16_choice() -> None:
    assert ck.status("cuda:0") == "off: cuda:0 device (the kernels are CPU-only)"
    assert ck.choice_status("cpu", "float16") == "off: dtype float16 (the kernels compute with fp32, bf16 or int8 weights)"
    assert ck.choice_status("cpu", "bfloat16") == ck.status("cpu")  # bf16 weights run on the kernels


def test_a_failed_build_is_off_with_the_compilers_message(tmp_path: Path) -> None:
    """A compiler that fails: the error carries its output (never thrown away)."""
    cc = tmp_path / "cc"
    cc.write_text("#!/bin/sh\necho 'zg_kernels.h:1: error: something the compiler said' >&2\nexit 1\n")
    cc.chmod(0o755)
    with pytest.raises(ck.KernelsUnavailable, match="something the compiler said"):
        ck.compile_kernels(str(cc), ck.FLAGS, tmp_path / "cache")
    assert not list((tmp_path / "cache").glob("zg_kernels-*"))  # nothing half-built left to load


def test_status_is_off_with_the_reason_in_a_process_without_a_compiler(tmp_path: Path) -> None:
    code = ("from zgtool.engine import cpu_kernels as ck; print(ck.status())")
    env = {"PATH": str(tmp_path), "XDG_CACHE_HOME": str(tmp_path), "HOME": str(tmp_path)}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    if ck.cpu_has_avx2_fma():
        assert out.stdout.strip() == "off: no C compiler (gcc/cc) found to build the kernels"
    else:
        assert out.stdout.strip().startswith("off: ")


@needs_avx2
def test_the_build_keeps_its_sources_and_log_beside_the_library() -> None:
    ck.library()
    built = ck.cache_dir() / f"zg_kernels-{ck.build_key(ck.build_flags())}"
    assert (built / ck.LIB_NAME).exists() and (built / "build.log").exists()
    assert {p.name for p in ck.source_files()} <= {p.name for p in built.iterdir()}


def test_metrics_expose_the_state_as_a_labelled_gauge() -> None:
    from zgtool.engine.server.metrics import ServerMetrics

    text = ServerMetrics("m", dict, kernels="off: disabled by ZGTOOL_NO_KERNELS").render().decode()
    assert 'zg_engine_kernels_enabled{model_name="m",state="off: disabled by ZGTOOL_NO_KERNELS"} 0.0' in text
    assert 'zg_engine_kernels_enabled{model_name="m",state="on"} 1.0' in ServerMetrics(
        "m", dict, kernels="on").render().decode()
    text = ServerMetrics("m", dict, kernels="on", kernel_isa="avx512bf16").render().decode()
    assert 'zg_engine_kernel_isa{isa="avx512bf16",model_name="m"} 1.0' in text


@needs_avx2
def test_verify_environment_names_the_variant_the_server_will_load(monkeypatch: pytest.MonkeyPatch) -> None:
    from zgtool.verify.run import _engine_choice

    class Cfg:
        model, dtype, num_threads = "smollm2", "auto", None

    monkeypatch.setenv(ck.ISA_ENV, "avx2")
    choice = _engine_choice(Cfg())  # type: ignore[arg-type]
    assert choice is not None and (choice["kernels"], choice["kernel_isa"]) == ("on", "avx2")
    assert choice["dtype"] == "bfloat16" and "bf16 weights on the C kernels" in str(choice["dtype_reason"])


def test_engine_status_reads_the_models_plan() -> None:
    class Plan:
        library_off = None
        gemm_off = None
        attention_off = "head_dim 12 is not a multiple of 8"
        norm_off = None
        glue_off = None

    class Model:
        plan = Plan()
        device = torch.device("cpu")

    class Engine:
        model = Model()

    assert ck.engine_status(Engine()) == "partial: torch for attention (head_dim 12 is not a multiple of 8)"
    Plan.attention_off = None
    assert ck.engine_status(Engine()) == "on"
    Plan.library_off = "disabled by ZGTOOL_NO_KERNELS"
    assert ck.engine_status(Engine()) == "off: disabled by ZGTOOL_NO_KERNELS"


def test_serve_banner_has_a_kernels_row() -> None:
    from zgtool.commands.serve_banner import kernels_row

    class NullEngine:
        model = None

    assert kernels_row(NullEngine()) == "off: no model (null backend)"
    if ck.cpu_has_avx2_fma():
        from zgtool.engine import Engine, EngineConfig

        e = Engine(EngineConfig(model="dummy:tiny", dtype="float32", device="cpu"))
        assert kernels_row(e) == f"on ({ck.isa()} variant: the best this CPU's flags allow)"


def test_the_null_backend_reports_its_kernels_as_cpu_kernels_would_without_loading_them() -> None:
    from zgtool.engine import Engine, EngineConfig
    from zgtool.engine.kernel_report import kernel_report

    e = Engine(EngineConfig(model="null"))
    assert kernel_report(e) == (ck.engine_status(e), ck.engine_isa(e)) == ("off: no model (null backend)", None)
    assert (e.device, e.dtype) == ("cpu", "none")


def test_the_null_backend_on_a_cuda_device_by_name_is_refused_where_there_is_none() -> None:
    from zgtool.engine import Engine, EngineConfig
    from zgtool.engine.errors import ModelLoadError

    if torch.cuda.is_available():
        assert Engine(EngineConfig(model="null", device="cuda")).device == "cuda"
        return
    with pytest.raises(ModelLoadError, match="no CUDA device"):
        Engine(EngineConfig(model="null", device="cuda"))

"""The prepared GPU check stays runnable on machines without a GPU: it says so and exits 4,
and its benchmark does the same, so CI catches a script that rots before a GPU is lent."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]


def test_gpu_check_script_is_valid_bash():
    subprocess.run(["bash", "-n", str(ROOT / "scripts/gpu_check.sh")], check=True)


@pytest.mark.skipif(torch.cuda.is_available(), reason="this is the no-GPU behaviour")
def test_gpu_check_without_cuda_writes_its_json_and_exits_4(tmp_path):
    proc = subprocess.run(["bash", str(ROOT / "scripts/gpu_check.sh"), str(tmp_path)], capture_output=True,
                          text=True, timeout=120, env={**os.environ, "PYTHON": sys.executable})
    assert proc.returncode == 4, proc.stdout + proc.stderr
    summary = json.loads((tmp_path / "gpu_check.json").read_text())
    assert summary["ok"] is False and summary["status"] == "no_cuda"
    assert "not run: no CUDA device" in (tmp_path / "gpu_check.log").read_text()


@pytest.mark.skipif(torch.cuda.is_available(), reason="this is the no-GPU behaviour")
def test_roofline_bench_without_cuda_says_not_run_and_exits_4():
    proc = subprocess.run([sys.executable, str(ROOT / "bench/gpu_roofline.py")], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 4
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == {"bench": "gpu_roofline",
                                                                "skipped": "no CUDA device"}


def test_roofline_bound_counts_weights_once_and_kv_per_sequence():
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        import gpu_roofline
    finally:
        sys.path.remove(str(ROOT / "bench"))
    from zgtool.engine.presets import preset

    spec = preset("llama-1b")
    bw = 4.8e12
    one = gpu_roofline.roofline_tok_s(spec, 1, 0, bw)
    assert one == pytest.approx(bw / (spec.num_params() * 2))
    # at a long context the KV reads dominate: more sequences can't beat the KV-only bound
    kv_per_token = spec.num_layers * 2 * spec.num_kv_heads * spec.dim_per_head * 2
    assert gpu_roofline.roofline_tok_s(spec, 64, 4096, bw) < bw / (4096 * kv_per_token)

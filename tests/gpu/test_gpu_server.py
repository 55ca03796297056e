"""The CUDA-only figures the server and the CLI expose: the load hint and dcgm --nvml."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import torch
from zgtest import run_zgtool

from zgtool.dcgm.metrics import GOLDEN
from zgtool.http.net import free_port

pytestmark = pytest.mark.gpu


def _zgtool(*args: str, **kw) -> subprocess.CompletedProcess[str]:
    return run_zgtool(*args, **kw)


def test_load_hint_carries_real_nvml_figures(tmp_path: Path):
    port = free_port()
    log = tmp_path / "serve.log"
    with log.open("wb") as fh:
        proc = subprocess.Popen([sys.executable, "-m", "zgtool", "serve", "--model", "dummy:tiny",
                                 "--device", "cuda", "--port", str(port)], stdout=fh, stderr=subprocess.STDOUT,
                                start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            assert proc.poll() is None, log.read_text()
            try:
                if httpx.get(url + "/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.1)
        r = httpx.post(url + "/v1/chat/completions", timeout=60, json={
            "model": "dummy:tiny", "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}]})
        assert r.status_code == 200, r.text
        hint = json.loads(r.headers["x-gpu-load-hint"])
        assert isinstance(hint["sm_util"], int | float) and 0 <= hint["sm_util"] <= 100
        total_gb = torch.cuda.get_device_properties(0).total_memory / 1024**3
        assert isinstance(hint["vram_free_gb"], int | float) and 0 < hint["vram_free_gb"] <= total_gb
        for key in ("kv_util", "running", "waiting"):
            assert key in hint
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=60)


def test_dcgm_watch_nvml_once_reads_the_five_golden_metrics():
    proc = _zgtool("dcgm", "watch", "--nvml", "--once", "--json")
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)["data"]
    assert data["source"]["kind"] == "nvml"
    assert data["gpus"], data
    last = data["gpus"][0]["last"]
    for metric in GOLDEN:
        assert last.get(metric) is not None, (metric, last)
    assert last["fb_used_bytes"] > 0 and last["sm_clock_mhz"] > 0 and last["power_w"] > 0


def test_cpu_only_features_degrade_never_invent_gpu_numbers_when_cuda_is_hidden():
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    proc = _zgtool("generate", "--model", "dummy:tiny", "--prompt", "hi", "--max-tokens", "4",
                   "--json", env=env)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["environment"].get("device", "cpu").startswith("cpu")

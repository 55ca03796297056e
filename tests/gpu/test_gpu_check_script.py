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


def _bench(name: str):
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        return __import__(name)
    finally:
        sys.path.remove(str(ROOT / "bench"))


def test_roofline_counts_an_untied_embedding_once_as_the_lm_head():
    from zgtool.engine.presets import preset

    spec = preset("llama-8b")
    assert not spec.tie_word_embeddings and 8.0e9 < spec.num_params() < 8.1e9
    read = _bench("gpu_roofline").weight_bytes(spec)
    assert read == 2 * (spec.num_params() - spec.vocab_size * spec.hidden_size)


def test_roofline_dry_run_takes_the_whole_path_on_cpu():
    proc = subprocess.run([sys.executable, str(ROOT / "bench/gpu_roofline.py"), "--dry-run"], capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["dry_run"] is True and result["target_met"] is False
    assert [(r["preset"], r["batch"]) for r in result["rows"]] == [("tiny", 1), ("tiny", 2)]
    for r in result["rows"]:
        assert r["step_ms_p50"] > 0 and r["step_ms_p99"] >= r["step_ms_p50"] and r["steps"] == 4
    assert result["presets"][0]["ttft_512_ms"] > 0


def test_the_transformers_peer_gets_our_models_very_weights():
    """bench/gpu_roofline.py's peer: our LlamaModel's fused weights back in transformers' naming give
    transformers' logits within 1e-4 of ours (CPU, fp32)."""
    transformers = pytest.importorskip("transformers")
    from zgtool.engine import Engine, EngineConfig
    from zgtool.engine.model import build_attn_meta

    e = Engine(EngineConfig(model="dummy:tiny", dtype="float32", device="cpu", enable_prefix_caching=False))
    model = e.model
    assert model is not None
    cfg = transformers.LlamaConfig(**{k: v for k, v in model.spec.to_hf_config().items() if k != "architectures"})
    hf = transformers.LlamaForCausalLM(cfg).eval()
    missing, unexpected = hf.load_state_dict(_bench("gpu_roofline").hf_state_dict(model), strict=False)
    assert not unexpected and all("rotary" in m or m == "lm_head.weight" for m in missing)
    ids = list(range(260, 290))
    bs = e.block_size
    table = list(range(-(-len(ids) // bs)))
    meta = build_attn_meta(list(range(len(ids))), [table[p // bs] * bs + p % bs for p in range(len(ids))],
                           [], [], [], [(0, len(ids), table, 0)], bs, torch.device("cpu"))
    with torch.no_grad():
        ours = model.logits(model.forward(torch.tensor(ids), meta))
        ref = hf(torch.tensor([ids])).logits[0]
    assert (ours - ref).abs().max().item() < 1e-4


def test_gateway_tax_summary_reads_a_latency_split_sweep():
    summarize = _bench("gateway_tax_summary").summarize

    def point(url, load, ttft, e2e, itl_count, ok=4):
        return {"target": url, "load": load, "num_ok": ok, "num_error": 0, "ttft_ms": {"p50": ttft, "mean": ttft},
                "e2e_ms": {"p50": e2e, "mean": e2e}, "itl_ms": {"count": itl_count, "mean": 1.0}}

    result = {"target": [{"url": "http://a", "model": "m"}, {"url": "http://b"}],
              "data": {"points": [point("http://a", 1.0, 10.0, 110.0, 400), point("http://b", 1.0, 12.0, 122.0, 40)]}}
    (row,) = summarize(result, ["direct", "nginx"])["rows"]
    # direct: 100 gaps a request, (110 - 10) / 100 = 1 ms a token; nginx: (122 - 12) / 100 = 1.1 ms
    assert row["path"] == "nginx" and row["ttft_tax_ms"] == 2.0 and row["engine_tpot_ms"] == 1.0
    assert row["tpot_tax_ms"] == pytest.approx(0.1) and row["tpot_tax_share_pct"] == pytest.approx(10.0)


def test_gpu_check_status_says_target_missed_when_every_stage_ran_but_a_target_did_not(tmp_path):
    (tmp_path / "pytest_gpu.xml").write_text('<testsuite><testcase classname="t" name="a" time="1"/></testsuite>')
    target = {"what": "llama-1b batch 1 % of roofline", "target": 50, "value": 31.5, "met": False}
    (tmp_path / "gpu_roofline.txt").write_text("table\n" + json.dumps({"bench": "gpu_roofline", "target_met": False,
                                                                         "targets": [target]}))
    (tmp_path / "gateway_tax").mkdir()
    (tmp_path / "gateway_tax" / "gateway_tax.json").write_text(json.dumps({"bench": "gateway_tax", "rows": []}))
    script = str(ROOT / "scripts/gpu_check_summary.py")
    proc = subprocess.run([sys.executable, script, str(tmp_path), "0", "0", "1", "2", "3", "0", "0", "4"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    summary = json.loads((tmp_path / "gpu_check.json").read_text())
    assert summary["ok"] is True and summary["status"] == "target_missed" and summary["target_met"] is False
    assert summary["targets_missed"] == ["llama-1b batch 1 % of roofline: 31.50 vs 50"]
    assert "TARGET MISSED" in proc.stdout and "target missed: llama-1b batch 1" in proc.stdout
    # a stage that failed is a failed check, whatever the targets
    proc = subprocess.run([sys.executable, script, str(tmp_path), "0", "1", "1", "2", "3", "0", "0", "4"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1 and json.loads((tmp_path / "gpu_check.json").read_text())["status"] == "failed"

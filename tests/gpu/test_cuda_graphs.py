"""The CUDA step of issue 35 on a real device: decode steps replay CUDA graphs (one per batch
bucket) with a stable shape at batch 1, replay is bit-identical to eager for the same batch, a
failed capture falls back to eager with the reason, and running out of GPU memory at start is a
one-line error naming the budget and --kv-memory-mb (exit 4). The CPU side of the same logic:
tests/engine/test_cuda_runner.py."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from zgtool.engine import Engine, EngineConfig, SamplingParams
from zgtool.engine.scheduler import ScheduledBatch

pytestmark = pytest.mark.gpu

GREEDY = SamplingParams(max_tokens=40, temperature=0, ignore_eos=True)
PROMPTS = [[256, *range(300 + 20 * i, 305 + 20 * i + i)] for i in range(4)]


def _engine(graphs: bool, **kw) -> Engine:
    return Engine(EngineConfig(model="dummy:small", dtype="bfloat16", device="cuda", block_size=16,
                               enable_prefix_caching=False, max_num_seqs=8, cuda_graphs=graphs, **kw))


def test_batch_one_decodes_replay_one_graph_every_step():
    e = _engine(True)
    runner = e.runner
    assert runner.graph_status == "on: batch buckets 1,2,4,8", runner.graph_status
    assert e.model is not None and e.model.backend_name == "triton"
    e.generate(PROMPTS[0], GREEDY)
    # every step after the prompt replayed the batch-1 graph: one fixed shape, no per-step plan
    assert runner.graph_replays == GREEDY.max_tokens - 1
    assert runner.eager_decode_steps == 0 and runner.eager_steps == 1
    assert e.stats()["cuda_graphs"].startswith("on")


def test_graph_replay_is_bit_identical_to_eager_for_the_same_batch():
    outs = {}
    for graphs in (True, False):
        e = _engine(graphs)
        outs[graphs] = [r.output_token_ids for r in e.generate(PROMPTS, GREEDY)]  # batch 4: a bucket
    assert outs[True] == outs[False]
    e = _engine(True)
    runner = e.runner
    seqs = [e._new_seq(p, GREEDY, f"r{i}", None) for i, p in enumerate(PROMPTS)]
    for s in seqs:
        e.scheduler.add(s)
    while any(s.num_output_tokens < 2 for s in seqs):
        e.step()
    batch = ScheduledBatch(list(seqs), [1] * 4)
    with torch.inference_mode():
        runner.fill(batch, 4)
        runner.buf.upload(4)
        eager = runner._decode_forward(4).clone()
        graph, out = runner._graphs[4]
        graph.replay()
        torch.cuda.synchronize()
    assert torch.equal(out, eager)


def test_a_failed_capture_decodes_eagerly_and_says_why(monkeypatch):
    class Broken:
        def __init__(self, *a, **k):
            raise RuntimeError("capture refused (test)")

    monkeypatch.setattr(torch.cuda, "graph", Broken)
    e = _engine(True)
    status = e.runner.graph_status
    assert status.startswith("off: capture failed at batch 8: RuntimeError: capture refused (test)"), status
    ref = _engine(False).generate(PROMPTS[1], GREEDY).output_token_ids
    assert e.generate(PROMPTS[1], GREEDY).output_token_ids == ref
    assert e.runner.graph_replays == 0 and e.runner.eager_decode_steps == GREEDY.max_tokens - 1


def test_out_of_gpu_memory_at_start_names_the_budget_and_exits_4():
    proc = subprocess.run([sys.executable, "-m", "zgtool", "serve", "--model", "dummy:llama-1b", "--device", "cuda",
                           "--kv-memory-mb", str(10 ** 8), "--max-num-seqs", "4096", "--port", "0"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 4, proc.stdout + proc.stderr
    err = proc.stderr.strip().splitlines()
    assert len(err) == 1 and "--kv-memory-mb" in err[0] and "MiB" in err[0], proc.stderr


def test_the_sdpa_fallback_at_batch_one_changes_shape_per_block_not_per_token(monkeypatch):
    """The issue's suspect: at batch 1 the SDPA decode trimmed K/V to the exact context, a new shape
    (and, with cuDNN, a new graph) every token. Now it attends over whole blocks with a mask."""
    e = _engine(False)
    assert e.model is not None
    e.model.triton_layers = False  # the fallback without triton: torch SDPA over gathered blocks
    e.runner.static_reason = "the test's SDPA fallback"  # its metadata per step, as without triton
    lengths: list[int] = []
    real = torch.nn.functional.scaled_dot_product_attention

    def recording(q, k, v, *args, **kwargs):
        if q.shape[-2] == 1:
            lengths.append(k.shape[-2])
        return real(q, k, v, *args, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", recording)
    prompt = [256, 300, 301]
    e.generate(prompt, GREEDY)
    per_step = lengths[::e.spec.num_layers]
    ctx = [len(prompt) + 1 + i for i in range(len(per_step))]
    assert per_step == [-(-c // 16) * 16 for c in ctx]

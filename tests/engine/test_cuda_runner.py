"""The CUDA runner's logic that needs no CUDA (engine/cuda_runner.py, engine/device_sampling.py),
run on CPU: batch-size buckets, the static step buffers and their one upload, the decode-only /
eager decision, pad rows, device sampling; and the CUDA compute path (engine/gpu_forward.py, the
Triton kernels in Triton's interpreter) against the path the CPU engine uses. Graphs themselves
need CUDA: tests/gpu/test_cuda_graphs.py."""

from __future__ import annotations

import os

import pytest
import torch

from zgtool.engine import Engine, EngineConfig, SamplingParams
from zgtool.engine.config import SamplingParams as SP
from zgtool.engine.cuda_runner import CudaRunner, bucket_for, graph_buckets
from zgtool.engine.device_sampling import NONFINITE, sample_on_device
from zgtool.engine.scheduler import ScheduledBatch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # read when the kernels are decorated (first import)

BS = 8
# the Triton path on CPU tensors runs in the interpreter only; on a CUDA machine tests/gpu runs it
interpreted = pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA here: tests/gpu/test_cuda_graphs.py")
PROMPTS = [[256, *range(300, 305)], [256, *range(310, 321)], [256, *range(330, 333)]]
GREEDY = SamplingParams(max_tokens=10, temperature=0, ignore_eos=True)


def test_buckets_double_up_to_the_running_cap_and_a_batch_takes_the_smallest_that_holds_it():
    assert graph_buckets(64) == (1, 2, 4, 8, 16, 32, 64)
    assert graph_buckets(48) == (1, 2, 4, 8, 16, 32, 48)
    assert graph_buckets(1) == (1,)
    assert [bucket_for(n, graph_buckets(48)) for n in (1, 3, 5, 17, 33, 48)] == [1, 4, 8, 32, 48, 48]
    assert bucket_for(49, graph_buckets(48)) is None


def _engine(triton: bool) -> Engine:
    e = Engine(EngineConfig(model="dummy:tiny", dtype="float32", device="cpu", block_size=BS,
                            enable_prefix_caching=False, max_num_seqs=8))
    assert e.model is not None
    if triton:
        pytest.importorskip("triton", reason="triton is not installed (the test extra installs it)")
        e.model.triton_layers = True
        assert e.model.backend_name == "triton" and e.model.attention.name == "triton-paged"
    return e


def _cuda_runner(e: Engine) -> CudaRunner:
    """The engine's runner replaced by the CUDA runner on CPU (graphs off), with its pad block."""
    assert e.model is not None
    e.model.allocate_kv(e.num_kv_blocks + 1, BS)
    runner = CudaRunner(e.model, BS, e.config.max_num_seqs, e.max_model_len, pad_block=e.num_kv_blocks,
                        cuda_graphs=True)
    e.runner = e.faults.runner = runner
    return runner


@interpreted
def test_static_decode_steps_on_the_triton_path_give_the_cpu_paths_tokens_with_one_upload_each(monkeypatch):
    # the reference: the engine's CPU path (C kernels, its own runner); the CUDA path's Triton
    # kernels (interpreted) through the static buffers must give the very same greedy tokens
    ref = [r.output_token_ids for r in _engine(False).generate(PROMPTS, GREEDY)]
    e = _engine(True)
    runner = _cuda_runner(e)
    assert runner.graph_status == "off: device cpu is not CUDA" and runner.static_reason is None
    uploads = []
    real = runner.buf.upload
    monkeypatch.setattr(runner.buf, "upload", lambda n: (uploads.append(n), real(n)))
    got = [r.output_token_ids for r in e.generate(PROMPTS, GREEDY)]
    assert got == ref
    # every decode step went through the static buffers (one upload each); the prompts ran eagerly
    assert runner.eager_decode_steps == len(uploads) >= GREEDY.max_tokens - 1
    assert runner.eager_steps >= 1 and runner.graph_replays == 0
    assert e.stats()["cuda_graphs"] == "off: device cpu is not CUDA"


@interpreted
def test_pad_rows_leave_the_real_rows_logits_and_kv_alone():
    e = _engine(True)
    runner = _cuda_runner(e)
    seqs = [e._new_seq(p, GREEDY, f"r{i}", None) for i, p in enumerate(PROMPTS[:3])]
    e.scheduler.waiting.extend(seqs)
    for _ in range(4):  # prompts, then a few decodes, through the engine's own steps
        e.step()
    batch = ScheduledBatch(list(seqs), [1] * 3)
    assert runner.is_static_decode(batch)
    assert not runner.is_static_decode(ScheduledBatch(list(seqs), [1, 2, 1]))  # a chunk: eager
    assert e.model is not None
    with torch.inference_mode():
        runner.fill(batch, 3)
        runner.buf.upload(3)
        alone = runner._decode_forward(3).clone()
        k_before = [k.clone() for k in e.model.k_cache]
        runner.fill(batch, 8)  # the bucket a graph would replay: 5 pad rows
        runner.buf.upload(8)
        padded = runner._decode_forward(8)
    # the CPU GEMM may split its work by the row count, so equal to fp32 rounding here; on CUDA the
    # same batch replayed and eager is bit-identical (tests/gpu/test_cuda_graphs.py)
    torch.testing.assert_close(padded[:3], alone, rtol=1e-5, atol=1e-5)
    pad = slice(e.num_kv_blocks * BS, (e.num_kv_blocks + 1) * BS)
    for before, after in zip(k_before, e.model.k_cache, strict=True):
        assert not torch.equal(before[pad], after[pad])  # the pad rows wrote the spare block...
        torch.testing.assert_close(after[:pad.start], before[:pad.start], rtol=1e-5, atol=1e-5)  # ...alone


def test_a_batch_of_one_attends_over_whole_blocks_so_its_shape_changes_per_block(monkeypatch):
    """Issue 35: SDPA decode at batch 1 trimmed K/V to the exact context, a new shape every token."""
    e = Engine(EngineConfig(model="dummy:tiny", dtype="float32", device="cpu", block_size=BS,
                            enable_prefix_caching=False))
    assert e.model is not None
    e.model.attn_kernel = False  # torch SDPA over the gathered blocks (the CUDA fallback's backend)
    assert e.model.attention.name == "torch-sdpa"
    lengths: list[int] = []
    real = torch.nn.functional.scaled_dot_product_attention

    def recording(q, k, v, *args, **kwargs):
        if q.shape[-2] == 1:  # a decode: one query per sequence
            lengths.append(k.shape[-2])
        return real(q, k, v, *args, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", recording)
    prompt = [256, 300, 301]
    e.generate(prompt, SamplingParams(max_tokens=20, temperature=0, ignore_eos=True))
    layers = e.spec.num_layers
    per_step = lengths[::layers]
    ctx = [len(prompt) + 1 + i for i in range(len(per_step))]
    assert per_step == [-(-c // BS) * BS for c in ctx]
    assert len(set(per_step)) == -(-ctx[-1] // BS) - -(-ctx[0] // BS) + 1  # one shape per block


def _logits(rows: int, vocab: int, seed: int) -> torch.Tensor:
    return torch.randn(rows, vocab, generator=torch.Generator().manual_seed(seed)) * 3


def test_device_sampling_greedy_rows_take_the_argmax_and_nonfinite_rows_come_back_flagged():
    x = _logits(4, 50, 1)
    x[2, 7] = float("nan")
    toks = sample_on_device(x, [SP(temperature=0)] * 4, [None] * 4).tolist()
    assert toks[2] == NONFINITE
    assert [t for i, t in enumerate(toks) if i != 2] == [int(x[i].argmax()) for i in (0, 1, 3)]


def test_a_seeded_row_draws_the_same_tokens_whatever_shares_its_batch():
    x = _logits(3, 200, 2)
    p = SP(temperature=0.9, top_p=0.9, top_k=40, seed=5)

    def gen():
        return torch.Generator().manual_seed(5)

    g_alone, g_batch = gen(), gen()
    alone = [sample_on_device(x[1:2], [p], [g_alone]).item() for _ in range(20)]
    others = [SP(temperature=1.0), p, SP(temperature=0)]
    batched = [sample_on_device(x, others, [None, g_batch, None])[1].item() for _ in range(20)]
    assert alone == batched and len(set(alone)) > 1


def test_top_k_and_top_p_keep_only_the_allowed_tokens_and_temperature_follows_softmax():
    x = torch.tensor([[4.0, 3.0, 2.0, 1.0, 0.0]]).repeat(4000, 1)
    torch.manual_seed(0)
    k2 = sample_on_device(x, [SP(temperature=1.0, top_k=2)] * 4000, [None] * 4000)
    assert set(k2.tolist()) == {0, 1}
    probs = torch.softmax(x[0], -1)  # top_p 0.7: the smallest set reaching 0.7 is the top two (0.64, 0.24)
    p = sample_on_device(x, [SP(temperature=1.0, top_p=0.7)] * 4000, [None] * 4000)
    assert set(p.tolist()) == {0, 1} and probs[0] < 0.7 <= probs[0] + probs[1]
    free = sample_on_device(x, [SP(temperature=1.0)] * 4000, [None] * 4000)
    freq = torch.bincount(free, minlength=5).float() / 4000
    assert (freq - probs).abs().max() < 0.03  # 4000 draws: a binomial sd of at most 0.008
    assert sample_on_device(x[:3], [SP(temperature=1.0, top_k=1)] * 3, [None] * 3).tolist() == [0, 0, 0]


def test_a_kv_pool_that_does_not_fit_is_one_line_naming_the_budget_and_the_flag(monkeypatch):
    from zgtool.engine.errors import ModelUnavailable  # the CLI's exit 4 (a missing capability)
    from zgtool.engine.runner import make_runner

    e = _engine(False)
    assert e.model is not None

    def oom(*_a):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 96.00 GiB")

    monkeypatch.setattr(e.model, "allocate_kv", oom)
    cfg = EngineConfig(model="dummy:tiny", kv_memory_bytes=96 << 30)
    with pytest.raises(ModelUnavailable) as err:
        make_runner(e.model, cfg, 1000, 1024)
    msg = str(err.value)
    assert "\n" not in msg and "--kv-memory-mb" in msg and "MiB (1000 blocks" in msg
    assert e.model.k_cache == []  # nothing half-allocated is kept


@interpreted
def test_the_triton_paths_fp32_logits_match_transformers_for_a_prompt_and_a_decode(tmp_path):
    """The CUDA compute path (Triton kernels, interpreted here) against transformers, fp32 within
    1e-4: a prompt chunk (RoPE+KV write, add+RMSNorm, SiLU*up, flash SDPA) then one decode (the
    paged decode kernel), the same numbers tests/gpu checks on the device."""
    transformers = pytest.importorskip("transformers")
    from zgtool.engine.model import build_attn_meta
    from zgtool.engine.weights import save_dummy_checkpoint

    path = save_dummy_checkpoint("tiny", tmp_path / "tiny")
    e = Engine(EngineConfig(model=str(path), dtype="float32", device="cpu", block_size=BS,
                            enable_prefix_caching=False))
    model = e.model
    assert model is not None
    model.triton_layers = True
    ids = list(range(260, 279))  # 18 prompt tokens over 3 blocks of 8, the decode at position 18
    n = len(ids) - 1
    table = list(range(-(-len(ids) // BS)))
    cpu = torch.device("cpu")
    slot = [table[p // BS] * BS + p % BS for p in range(len(ids))]
    with torch.no_grad():
        prompt = model.logits(model.forward(torch.tensor(ids[:n]), build_attn_meta(
            list(range(n)), slot[:n], [], [], [], [(0, n, table, 0)], BS, cpu)))
        decode = model.logits(model.forward(torch.tensor(ids[n:]), build_attn_meta(
            [n], slot[n:], [0], [table], [n + 1], [], BS, cpu)))
        hf = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
        ref = hf(torch.tensor([ids])).logits[0]
    assert (prompt - ref[:n]).abs().max().item() < 1e-4
    assert (decode[0] - ref[n]).abs().max().item() < 1e-4

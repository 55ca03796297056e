"""Model runners: turn a ScheduledBatch into tensors, run the forward, sample.

All tensors live here; the scheduler and block manager never see one. The model runner itself is in
engine/model_runner.py (handback.py and cuda_runner.py subclass or use it; make_runner below builds
them, so they import that leaf, not this module)."""

from __future__ import annotations

from typing import Protocol

import torch

from zgtool.engine.config import EngineConfig
from zgtool.engine.model import LlamaModel
from zgtool.engine.model_runner import ModelRunner
from zgtool.engine.null_runner import NullRunner
from zgtool.engine.scheduler import ScheduledBatch

# ModelRunner lives in engine/model_runner.py, NullRunner in engine/null_runner.py (re-exported for callers)
__all__ = ["ModelRunner", "NullRunner", "Runner", "make_runner", "weights_oom"]


class Runner(Protocol):
    def execute(self, batch: ScheduledBatch) -> list[int | None]: ...


def weights_oom(model: str, device: str) -> Exception:
    """Out of device memory for the weights at start-up: one line for the CLI (exit 4)."""
    from zgtool.engine.errors import ModelUnavailable

    return ModelUnavailable(f"out of {device.split(':')[0].upper()} memory loading the weights of {model!r}: the "
                            "model does not fit this device (the KV pool comes after it: --kv-memory-mb sizes that)")


def make_runner(model: LlamaModel, cfg: EngineConfig, num_blocks: int, max_model_len: int) -> ModelRunner:
    """The runner for the model's device, chosen once at start-up, after the KV pool is allocated:
    on CUDA engine/cuda_runner.py (static buffers, device sampling, graphs unless cfg.cuda_graphs is
    off, one spare pad block past num_blocks), elsewhere the step thread's hand-back runner. Out of
    device memory for the pool: ModelUnavailable naming the budget and --kv-memory-mb (CLI exit 4)."""
    from zgtool.engine.handback import HandbackRunner

    on_cuda = model.device.type == "cuda"
    blocks = num_blocks + (1 if on_cuda else 0)
    try:
        model.allocate_kv(blocks, cfg.block_size)
    except torch.OutOfMemoryError:
        from zgtool.engine.errors import ModelUnavailable

        model.k_cache, model.v_cache = [], []
        mib = blocks * model.kv_bytes_per_block(cfg.block_size) / 2**20
        source = "--kv-memory-mb" if cfg.kv_memory_bytes is not None else f"{cfg.kv_memory_fraction:g} of free memory"
        raise ModelUnavailable(f"out of {model.device.type.upper()} memory allocating the KV pool: a budget of "
                               f"{mib:.0f} MiB ({blocks} blocks, {source}) does not fit beside the weights; "
                               "give a smaller --kv-memory-mb") from None
    if not on_cuda:
        return HandbackRunner(model, cfg.block_size)
    from zgtool.engine.cuda_runner import CudaRunner

    return CudaRunner(model, cfg.block_size, cfg.max_num_seqs, max_model_len, pad_block=num_blocks,
                      cuda_graphs=cfg.cuda_graphs)

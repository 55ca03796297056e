"""KV pool sizing, device/dtype choice, GPU figures, and the KV report + defrag actions."""

from __future__ import annotations

import os
from typing import Any, Protocol

from zgtool.engine.config import EngineConfig


class Engine(Protocol):
    """What the KV report and defrag read of zgtool.engine.engine.Engine (which imports this module): a
    Protocol, so there is no import circle (tests/structure/test_import_cycles.py)."""

    @property
    def block_manager(self) -> Any: ...
    @property
    def kv_bytes_per_block(self) -> Any: ...
    @property
    def device(self) -> str: ...
    @property
    def model(self) -> Any: ...

    def live_sequences(self) -> Any: ...

CPU_KV_CAP_BYTES = 512 * 1024**2


def pick_device_dtype(cfg: EngineConfig, torch: Any) -> tuple[str, str, Any]:
    device = cfg.device
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda") and not torch.cuda.is_available():
        from zgtool.engine.errors import ModelLoadError

        raise ModelLoadError("device cuda requested but no CUDA device is available (use --device cpu)")
    from zgtool.engine.config import resolve_dtype

    dtype = resolve_dtype(cfg.dtype, device)
    if dtype == "int8" and not device.startswith("cpu"):
        from zgtool.engine.errors import ModelLoadError

        raise ModelLoadError("dtype int8 runs on CPU only (an AVX2 kernel); use --device cpu or another dtype")
    # int8 travels as torch.int8 to load_model (reads fp32) and LlamaModel (quantizes the projections)
    return device, dtype, getattr(torch, dtype)


def _max_useful_blocks(cfg: EngineConfig, max_model_len: int) -> int:
    # every seat full at max length, plus as much again for the prefix cache
    return 2 * cfg.max_num_seqs * -(-max_model_len // cfg.block_size)


def null_blocks(cfg: EngineConfig, max_model_len: int) -> int:
    if cfg.kv_memory_bytes is not None:
        return max(1, cfg.kv_memory_bytes // (64 * 1024))  # nominal block size for accounting
    return _max_useful_blocks(cfg, max_model_len)


def num_blocks(cfg: EngineConfig, bytes_per_block: int, max_model_len: int, torch: Any) -> int:
    if cfg.kv_memory_bytes is not None:
        budget = cfg.kv_memory_bytes
    elif torch.cuda.is_available() and cfg.device != "cpu":
        free, _total = torch.cuda.mem_get_info()
        budget = int(free * cfg.kv_memory_fraction)
    else:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        budget = min(int(total * cfg.kv_memory_fraction), CPU_KV_CAP_BYTES)
    n = budget // bytes_per_block
    if n < 1:
        from zgtool.engine.errors import ModelLoadError

        raise ModelLoadError(f"KV memory budget {budget} B is smaller than one block ({bytes_per_block} B)")
    return int(min(n, _max_useful_blocks(cfg, max_model_len)))


def gpu_figures(device: str) -> dict[str, Any]:
    """sm_util / vram_free_gb only when really measured on a GPU; None otherwise."""
    out: dict[str, Any] = {"sm_util": None, "vram_free_gb": None}
    if not device.startswith("cuda"):
        return out
    import torch

    try:
        free, _ = torch.cuda.mem_get_info()
        out["vram_free_gb"] = round(free / 1024**3, 2)
    except Exception:  # noqa: BLE001
        pass
    try:
        import pynvml

        pynvml.nvmlInit()
        h = pynvml.nvmlDeviceGetHandleByIndex(torch.cuda.current_device())
        out["sm_util"] = float(pynvml.nvmlDeviceGetUtilizationRates(h).gpu)
    except Exception:  # noqa: BLE001 - no NVML: leave it unmeasured
        pass
    return out


def kv_report(engine: Engine) -> dict[str, Any]:
    bm = engine.block_manager
    rep: dict[str, Any] = {
        "kv_blocks_total": bm.num_blocks,
        "kv_blocks_used": bm.num_used_blocks,
        "kv_blocks_free": bm.num_free_blocks,
        "kv_blocks_cached": bm.num_cached_free_blocks,
        "fragmentation": round(bm.fragmentation(), 6),
        "block_size": bm.block_size,
        "kv_bytes_per_block": engine.kv_bytes_per_block,
        "device": engine.device,
    }
    if engine.device.startswith("cuda"):
        import torch

        st = torch.cuda.memory_stats()
        rep["allocator_reserved_bytes"] = int(st.get("reserved_bytes.all.current", 0))
        rep["allocator_allocated_bytes"] = int(st.get("allocated_bytes.all.current", 0))
        rep["inactive_split_bytes"] = int(st.get("inactive_split_bytes.all.current", 0))
    return rep


def defrag(engine: Engine, dry_run: bool, drop_prefix_cache: bool) -> dict[str, Any]:
    """Runs in the step thread between steps, so no in-flight output changes: live blocks are
    copied to the lowest ids (KV data moves with them) and block tables rewritten."""
    bm = engine.block_manager
    before = kv_report(engine)
    plan = bm.compaction_plan()
    actions: list[str] = []
    if dry_run:
        return {"dry_run": True, "before": before, "after": before,
                "planned_moves": len(plan), "actions": []}
    if drop_prefix_cache:
        n = bm.drop_cached()
        actions.append(f"dropped {n} evictable prefix-cache blocks")
        plan = bm.compaction_plan()
    if plan:
        if engine.model is not None:
            engine.model.copy_blocks(plan)
        bm.apply_compaction(plan, engine.live_sequences())
        actions.append(f"moved {len(plan)} live blocks to the low end of the pool")
    if engine.device.startswith("cuda"):
        import torch

        torch.cuda.empty_cache()
        actions.append("torch.cuda.empty_cache()")
    if not actions:
        actions.append("nothing to do: the pool is already compact")
    return {"dry_run": False, "before": before, "after": kv_report(engine),
            "planned_moves": len(plan), "actions": actions}

"""The fused engine: paged-KV Llama forward, prefix caching, continuous batching.

Exports resolve lazily so that importing config or errors never imports torch.
"""

from __future__ import annotations

from typing import Any

__all__ = ["Engine", "EngineConfig", "SamplingParams", "GenerateResult"]


def __getattr__(name: str) -> Any:
    if name in ("EngineConfig", "SamplingParams"):
        from zgtool.engine import config

        return getattr(config, name)
    if name in ("Engine", "GenerateResult"):
        from zgtool.engine import engine

        return getattr(engine, name)
    raise AttributeError(name)

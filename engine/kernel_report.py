"""What an engine computes with, for its banner, results and /metrics, read without loading torch
for the null backend (engine/cpu_kernels.py, which reports on a model's kernels, imports it)."""

from __future__ import annotations

NULL_BACKEND = "off: no model (null backend)"


def kernel_report(engine: object) -> tuple[str, str | None]:
    """(engine_status, engine_isa) of engine/cpu_kernels.py: "on", "off: <why>" or "partial: ...",
    and the ISA variant the kernels run (None when off)."""
    if getattr(engine, "model", None) is None:
        return NULL_BACKEND, None
    from zgtool.engine.cpu_kernels import engine_isa, engine_status

    return engine_status(engine), engine_isa(engine)

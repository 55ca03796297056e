"""Command modules; each exposes register(app). Keep imports at module level light."""

from __future__ import annotations

from collections.abc import Callable

import typer

from zgtool.commands import (
    bench,
    client,
    compare,
    dcgm,
    gate,
    gateway,
    generate,
    grafana,
    latency,
    probe,
    report,
    serve,
    targets,
    verify,
)

REGISTRY: list[Callable[[typer.Typer], None]] = [
    generate.register,
    serve.register,
    gateway.register,
    targets.register,
    probe.register,
    latency.register,
    compare.register,
    bench.register,
    gate.register,
    dcgm.register,
    report.register,
    verify.register,
    client.register,
    grafana.register,
]

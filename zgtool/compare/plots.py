"""compare's figures as PNG and SVG: each run's TTFT/ITL/total distributions per path, and the tax
per hop across runs. matplotlib is the `plots` extra, imported here only (never on the engine's or
the CLI's start-up path); without it, asking for plots is exit 4 naming the extra."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from zgtool.compare.runs import Run
from zgtool.compare.stats import TaxRow
from zgtool.extras import require_extra

DISTRIBUTIONS = ("ttft_ms", "itl_ms", "total_ms")


def _pyplot() -> Any:
    require_extra("compare --plots", "plots", {"matplotlib": "matplotlib"})
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _values(target: dict, metric: str) -> list[float]:
    out: list[float] = []
    for s in target.get("samples") or ():
        if not s.get("ok"):
            continue
        v = s.get(metric)
        if isinstance(v, list):
            out += [float(x) for x in v if isinstance(x, int | float)]
        elif isinstance(v, int | float):
            out.append(float(v))
    return out


def write_plots(runs: list[Run], taxes: list[TaxRow], out_dir: Path) -> list[Path]:
    plt = _pyplot()
    out_dir.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    paths = runs[0].path_names
    fig, axes = plt.subplots(len(DISTRIBUTIONS), 1, figsize=(max(6.0, 1.2 * len(runs) * len(paths)), 9),
                             squeeze=False)
    for ax, metric in zip(axes[:, 0], DISTRIBUTIONS, strict=True):
        data, labels = [], []
        for i in range(len(paths)):
            for run in runs:
                data.append(_values(run.targets[i], metric) or [float("nan")])
                labels.append(f"{run.label}\npath {i + 1}")
        ax.boxplot(data, showfliers=False)
        ax.set_xticks(range(1, len(labels) + 1), labels, fontsize=7)
        ax.set_ylabel(f"{metric}")
        ax.set_title(f"{metric} per run and path (boxes: quartiles, whiskers 1.5 IQR)", fontsize=9)
    fig.tight_layout()
    written += _save(fig, out_dir / "distributions", plt)
    if taxes:
        fig, ax = plt.subplots(figsize=(max(6.0, 1.0 * len(runs)), 4))
        for n, t in enumerate(taxes):
            xs = [k for k, d in enumerate(t.per_run) if d is not None]
            ds = [d for d in t.per_run if d is not None]
            ax.errorbar([x + 0.08 * n for x in xs], [d[0] for d in ds],
                        yerr=[[d[0] - d[1] for d in ds], [d[2] - d[0] for d in ds]], fmt="o", capsize=3,
                        label=f"path {t.candidate + 1} {t.phase}")
        ax.axhline(0, color="grey", lw=0.8)
        ax.set_xticks(range(len(runs)), [r.label for r in runs], fontsize=8)
        ax.set_ylabel("tax vs path 1, ms (95% within-run interval)")
        ax.legend(fontsize=7)
        fig.tight_layout()
        written += _save(fig, out_dir / "tax_per_hop", plt)
    return written


def _save(fig: Any, stem: Path, plt: Any) -> list[Path]:
    paths = [stem.with_suffix(".png"), stem.with_suffix(".svg")]
    for p in paths:
        fig.savefig(p, dpi=110)
    plt.close(fig)
    return paths

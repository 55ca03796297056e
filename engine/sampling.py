"""Token sampling: greedy, temperature, top-k, top-p, per-request seeded generators."""

from __future__ import annotations

from collections.abc import Callable

import torch

from zgtool.engine.config import SamplingParams
from zgtool.engine.errors import SequenceFault

NonfiniteRows = Callable[[torch.Tensor], list[int]]


def torch_nonfinite_rows(logits: torch.Tensor) -> list[int]:
    ok = torch.isfinite(logits).all(dim=-1)
    return [] if bool(ok.all()) else [int(i) for i in (~ok).nonzero().flatten().tolist()]


def check_finite(logits: torch.Tensor, nonfinite_rows: NonfiniteRows | None = None) -> None:
    """Rows whose logits are not all finite (a model fault, never a token 0): SequenceFault.
    `nonfinite_rows` is the model's own check (one C pass where it runs on the kernels,
    LlamaModel.nonfinite_rows), else torch."""
    rows = (nonfinite_rows or torch_nonfinite_rows)(logits)
    if rows:
        raise SequenceFault(rows, "non-finite logits")


def make_generator(params: SamplingParams, device: torch.device) -> torch.Generator | None:
    if params.seed is None or params.greedy:
        return None
    return torch.Generator(device=device).manual_seed(params.seed)


def sample(logits: torch.Tensor, params: list[SamplingParams], generators: list[torch.Generator | None],
           nonfinite_rows: NonfiniteRows | None = None) -> list[int]:
    """logits [N, V] float32 -> one token id per row. Finite logits never give NaN probabilities:
    each row is shifted by its max before the temperature divides it, so the top logit maps to
    exp(0) = 1 and the sum is >= 1 whatever the temperature."""
    check_finite(logits, nonfinite_rows)
    greedy_rows = [i for i, p in enumerate(params) if p.greedy]
    if len(greedy_rows) == len(params):  # all greedy: one argmax, one host copy
        return [int(t) for t in logits.argmax(dim=-1).tolist()]
    out = [0] * len(params)
    if greedy_rows:
        idx = torch.tensor(greedy_rows, device=logits.device)
        for i, t in zip(greedy_rows, logits[idx].argmax(dim=-1).tolist(), strict=True):
            out[i] = int(t)
    for i, p in enumerate(params):
        if p.greedy:
            continue
        row = logits[i].float()
        row = (row - row.max()) / p.temperature
        if p.top_k > 0 and p.top_k < row.shape[-1]:
            kth = torch.topk(row, p.top_k).values[-1]
            row = row.masked_fill(row < kth, float("-inf"))
        probs = torch.softmax(row, dim=-1)
        if p.top_p < 1.0:
            sorted_p, sorted_i = probs.sort(descending=True)
            cum = sorted_p.cumsum(-1)
            drop = cum - sorted_p > p.top_p  # keep the smallest set whose mass reaches top_p
            sorted_p = sorted_p.masked_fill(drop, 0.0)
            probs = torch.zeros_like(probs).scatter_(-1, sorted_i, sorted_p)
        out[i] = int(torch.multinomial(probs, 1, generator=generators[i]).item())
    return out

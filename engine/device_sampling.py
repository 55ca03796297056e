"""Sampling on the model's device (the CUDA runner, engine/cuda_runner.py): greedy, temperature,
top-k and top-p per row, per-request seeds, and a non-finite check, with no host value read until
the one device-to-host copy of the sampled ids (a row whose logits are not all finite comes back
as -1, never as a token).

A sampled row draws by the exponential race: argmax(p / E) with E ~ Exp(1) per vocabulary entry,
which picks token i with probability p_i (the Gumbel-max trick in another form) from one
vectorised pass. A row with a seed draws its noise from its own generator, so its tokens do not
depend on what shares its batch; rows without one share the device's default generator. The
filters match engine/sampling.py (the CPU path): the logits shifted by their max, divided by the
temperature, top-k on them, softmax, top-p keeping the smallest set whose mass reaches top_p.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from zgtool.engine.config import SamplingParams

NONFINITE = -1


def needs_filter(params: Sequence[SamplingParams]) -> bool:
    """Whether any sampled row uses top-k or top-p (the sort over the vocabulary is then paid)."""
    return any(not p.greedy and ((0 < p.top_k) or p.top_p < 1.0) for p in params)


def sample_on_device(logits: torch.Tensor, params: Sequence[SamplingParams],
                     generators: Sequence[torch.Generator | None], temps: torch.Tensor | None = None,
                     top_k: torch.Tensor | None = None, top_p: torch.Tensor | None = None) -> torch.Tensor:
    """logits [N, V] -> int64 [N] token ids on the device, NONFINITE for a row with a NaN or an
    infinity. temps/top_k/top_p: the rows' parameters already on the device (float/int64/float [N],
    written by the caller's one host-to-device copy; temperature 0 for a greedy row); None: made
    here from params."""
    dev = logits.device
    x = logits.float()
    bad = ~torch.isfinite(x).all(dim=-1)
    greedy_tok = x.argmax(dim=-1)
    sampled = [i for i, p in enumerate(params) if not p.greedy]
    if not sampled:
        return torch.where(bad, NONFINITE, greedy_tok)
    if temps is None or top_k is None or top_p is None:
        temps = torch.tensor([0.0 if p.greedy else p.temperature for p in params], dtype=torch.float32, device=dev)
        top_k = torch.tensor([p.top_k for p in params], dtype=torch.long, device=dev)
        top_p = torch.tensor([p.top_p for p in params], dtype=torch.float32, device=dev)
    greedy = temps.float() <= 0  # a greedy row (SamplingParams.greedy) carries temperature 0 here
    # finite rows only: a NaN row is reported, never sampled (its noise would poison nothing else)
    x = torch.where(bad[:, None], 0.0, x)
    x = (x - x.max(dim=-1, keepdim=True).values) / torch.where(greedy, 1.0, temps.float())[:, None]
    if needs_filter(params):
        x = _filter(x, top_k, top_p.float())
    probs = torch.softmax(x, dim=-1)
    noise = torch.empty_like(probs)
    shared = [i for i in sampled if generators[i] is None]
    if shared:
        noise.exponential_()
    for i in sampled:
        g = generators[i]
        if g is not None:
            noise[i].exponential_(generator=g)
    tok = torch.where(greedy, greedy_tok, (probs / noise).argmax(dim=-1))
    return torch.where(bad, NONFINITE, tok)


def _filter(x: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """x [N, V] (shifted, tempered logits) with entries outside each row's top-k, then outside its
    top-p mass, set to -inf; k = 0 and p = 1 keep everything."""
    vocab = x.shape[-1]
    sorted_x, order = x.sort(dim=-1, descending=True)
    rank = torch.arange(vocab, device=x.device)[None, :]
    k = torch.where(top_k > 0, top_k.clamp(max=vocab), vocab)[:, None]
    keep = rank < k
    sorted_x = sorted_x.masked_fill(~keep, float("-inf"))
    p = torch.softmax(sorted_x, dim=-1)
    keep &= (p.cumsum(dim=-1) - p) <= top_p[:, None]  # the smallest set whose mass reaches top_p
    sorted_x = sorted_x.masked_fill(~keep, float("-inf"))
    return torch.full_like(x, float("-inf")).scatter(-1, order, sorted_x)

"""latency-split's token counts (--tokenizer): which source counts the prompts (zgtool.workload.tokens), the
synthetic prompts rebuilt to their exact requested lengths under it before anything is measured, and, after
the run, the requested prompt tokens beside what each target's usage reported: a difference above
MISMATCH_PCT is a warning. Output tokens are always the response's usage."""

from __future__ import annotations

from dataclasses import dataclass, replace
from statistics import fmean
from typing import TYPE_CHECKING, Any

from zgtool.targets import Target
from zgtool.workload.tokens import FILLER, Counter, counter_for, refit

if TYPE_CHECKING:
    from zgtool.commands.latency_options import SplitOptions
    from zgtool.latency.config import SplitConfig
    from zgtool.latency.records import SplitResult

MISMATCH_PCT = 2.0
TOKENIZE_TIMEOUT_S = 3.0        # per tokenize request (a silent route stops the search at once)


@dataclass(frozen=True)
class TokenCounting:
    counter: Counter
    requested: tuple[int, ...]          # prompt tokens of each distinct request under the counter
    targets: tuple[int | None, ...] = ()   # a generator's requested length per request (None: a dataset's own)
    said: bool = True                   # fall-backs are warnings (--tokenizer server/PATH); auto's are noted only


def _base(url: str) -> str:
    from zgtool.latency.wire.detect import _base as base_of

    return base_of(Target("t", url))


def count_for_config(choice: str, targets: list[Target], cfg: SplitConfig) -> tuple[SplitConfig, TokenCounting]:
    """The counter for --tokenizer CHOICE on the targets (the first that counts, in order), and the config with
    a synthetic workload's prompts refitted to their exact lengths under it (a dataset's prompts counted as they
    are; the one prompt of a run without a workload counted too)."""
    first, rest = targets[0], targets[1:]
    counter = counter_for(choice, _base(first.url), first.model, headers=first.auth_headers(), verify=cfg.verify,
                          timeout_s=min(cfg.timeout_s, TOKENIZE_TIMEOUT_S),
                          more=tuple((_base(t.url), t.model, t.auth_headers()) for t in rest))
    said = choice != "auto"
    if cfg.workload is None:
        return cfg, TokenCounting(counter, (counter.count(cfg.prompt),), said=said)
    wl, counts = refit(cfg.workload, counter)
    return replace(cfg, workload=wl), TokenCounting(counter, counts, tuple(s.input_tokens for s in wl.specs), said)


def count_tokens(opts: SplitOptions, resolved: list[Target]) -> tuple[SplitOptions, TokenCounting]:
    """count_for_config for latency-split's options (the workload kept in both of its places)."""
    split, counting = count_for_config(opts.tokenizer, resolved, opts.split)
    if opts.workload is None or split.workload is None:
        return replace(opts, split=split), counting
    return replace(opts, split=split, workload=replace(opts.workload, workload=split.workload)), counting


def token_counts(counting: TokenCounting, res: SplitResult, num_requests: int) -> tuple[dict[str, Any], list[str]]:
    """The result's token_counts and the warning lines: per target, the requested prompt tokens of the requests
    it answered beside the prompt tokens its usage reported."""
    req = counting.requested
    per_target: dict[str, Any] = {}
    warnings: list[str] = []
    for tr in res.targets:
        pairs = [(req[s.index % len(req)], s.input_tokens) for s in tr.samples
                 if s.ok and s.input_tokens is not None]
        if not pairs:
            per_target[tr.name] = {"server_prompt_tokens_mean": None}
            continue
        want, got = fmean(p[0] for p in pairs), fmean(p[1] for p in pairs)
        pct = (got - want) / want * 100 if want else 0.0
        per_target[tr.name] = {"requested_prompt_tokens_mean": round(want, 1),
                               "server_prompt_tokens_mean": round(got, 1), "difference_pct": round(pct, 2)}
        claimed = counting.counter is not FILLER or any(t is not None for t in counting.targets)
        if abs(pct) > MISMATCH_PCT and claimed:     # filler words claim no length for a fixed prompt
            # a count of the user text alone misses what the server's count holds besides it
            why = ("; the server's count includes its chat template (role markers, any default system prompt), "
                   "which this count leaves out" if got > want and not counting.counter.templated else "")
            warnings.append(f"{tr.name}: prompts were built for {want:.1f} tokens on average (counted by "
                            f"{counting.counter.source}) but the server reported {got:.1f} ({pct:+.1f}%){why}")
    out = {**counting.counter.public(), "output_tokens": "the response's usage",
           "requested_prompt_tokens_mean": round(fmean(req), 1), "targets": per_target}
    built = [(want, got) for want, got in zip(counting.targets, req, strict=False) if want is not None]
    if built:
        out["synthetic_prompts_exact"] = f"{sum(w == g for w, g in built)}/{len(built)}"
        warnings += [f"a synthetic prompt asked for {w} tokens has {g} under {counting.counter.source} (the "
                     "nearest it could be built)" for w, g in built if w != g][:3]
    return out, [*(counting.counter.notes if counting.said else ()), *warnings]

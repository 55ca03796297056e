"""latency-split's side of a workload: sizing the run from it, the trace's schedule, and the prefix-cache
hit rate read from the engines' /metrics around the measured requests.

Every target gets the same requests in the same order (request i sends spec i mod N), so the paths are
paired. Where targets share one engine (direct and a gateway in front of it), the target measured second
in a round meets that round's prompts already cached; the runner alternates which target goes first
(A B, B A, ...), so the warm side alternates too, and the per-target hit rates show what each one got."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from zgtool.errors import UsageError
from zgtool.workload.model import Workload
from zgtool.workload.prefix_cache import PrefixWatch, metrics_url, read

DEFAULT_REQUESTS = 50


@dataclass(frozen=True)
class SplitWorkload:
    """What latency-split needs from --dataset: the workload, -n, and the trace's send offsets."""

    workload: Workload
    num_requests: int
    schedule_s: tuple[float, ...] | None

    def summary(self) -> str:
        """One line for the terminal: what the run sends."""
        wl = self.workload
        pub = wl.public()
        what = wl.name if wl.name.startswith(wl.kind + ":") else f"{wl.kind} {wl.name}"
        line = (f"workload {what}: {len(wl.specs)} distinct request(s), {self.num_requests} sent per "
                f"target, prompts {pub['prompt_chars_mean']:.0f} chars and max_tokens {pub['max_tokens_mean']:.0f} "
                "on average")
        return "; ".join([line, *wl.notes])

    def config_fields(self) -> dict[str, Any]:
        out: dict[str, Any] = {"workload": self.workload}
        if self.schedule_s is not None:
            out["schedule_s"] = self.schedule_s
        return out


def prepare(spec: str, *, requests: int | None, concurrency: int, rate: str | None, speedup: float,
            max_tokens: int) -> SplitWorkload:
    """Load --dataset before anything is sent. Without -n, a file or multi-turn runs its own length and a
    generator without n= runs 50; a trace is replayed at its timestamps (open loop, c=1)."""
    from zgtool.workload.spec import load_workload

    wl = load_workload(spec, num_requests=requests or DEFAULT_REQUESTS, max_tokens=max_tokens, speedup=speedup)
    n = requests if requests is not None else len(wl.specs)
    if wl.offsets_s is None:
        if speedup != 1.0:
            raise UsageError("--speedup applies to a trace (--dataset trace:FILE) only")
        return SplitWorkload(wl, n, None)
    if rate is not None:
        raise UsageError("a trace is replayed at its own timestamps; --rate does not apply to it")
    if concurrency != 1:
        raise UsageError("a trace is replayed open-loop at its timestamps; -c does not apply "
                         "(--max-in-flight bounds the requests in flight)")
    if n > len(wl.offsets_s):
        raise UsageError(f"-n {n}: the trace {wl.name} has only {len(wl.offsets_s)} requests")
    return SplitWorkload(wl, n, wl.offsets_s[:n])


def prefix_watch(target_urls: list[str], explicit: list[str], verify: bool | str = True) -> PrefixWatch | None:
    """Watch the explicit URLs (--metrics-url, --vllm-metrics) and each target's own /metrics that answers
    with prefix-cache counters (zgtool serve, vLLM); None when none does. `verify` as for the requests."""
    from zgtool.latency.wire.client import ssl_context

    ctx = ssl_context(verify) if any(u.startswith("https:") for u in [*target_urls, *explicit]) else None
    urls = list(dict.fromkeys(explicit))
    for u in target_urls:
        m = metrics_url(u)
        if m not in urls and read(m, ctx=ctx) is not None:
            urls.append(m)
    return PrefixWatch(urls, ctx) if urls else None


def describe(rows: list[dict[str, Any]]) -> list[str]:
    """Lines for the terminal, beside the latency tables: per engine, the whole run and each target."""
    def pct(r: dict[str, Any]) -> str:
        return "n/a (no prompt tokens looked up)" if r["hit_rate"] is None else f"{100 * r['hit_rate']:.1f}%"

    out = []
    for r in rows:
        out.append(f"prefix-cache hit rate {pct(r)}: {r['hit_tokens']:.0f} of {r['query_tokens']:.0f} prompt tokens "
                   f"found in the cache ({r['source']} {r['url']}, over the measured requests)")
        if len(r["targets"]) > 1:
            out.extend(f"  {name}: {pct(t)} ({t['hit_tokens']:.0f} of {t['query_tokens']:.0f})"
                       for name, t in r["targets"].items())
    return out


def watch_split(targets: list[Any], cfg: Any, explicit: list[str] | None = None,
                inner: list[Any] | None = None) -> tuple[PrefixWatch | None, list[Any] | None]:
    """(the watch, the runner hooks) for a latency split of `targets` (zgtool.targets.Target) under `cfg`
    (SplitConfig): each target's /metrics is tried when cfg has a workload; `inner` hooks stay first."""
    from zgtool.latency.schedule.runner import _split

    urls = [t.url for t in targets] if cfg.workload is not None else []
    watch = prefix_watch(urls, explicit or [], cfg.verify) if urls or explicit else None
    if watch is None:
        return None, inner
    return watch, watch.hooks(inner, [t.name for t in targets], _split(cfg.num_requests, cfg.effective_rounds),
                              cfg.open_loop)

"""Could the measurement vouch for itself? From latency_split results: the share of requests whose
receive times zgtool's own client could not vouch for (client lag), open-loop runs whose load
generator fell behind its schedule, and the machine's load when each result was written. These
lines go in the report's headline area, beside the verdict they qualify."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from zgtool.report.tax import config_label


@dataclass(frozen=True)
class Health:
    requests_ok: int
    requests_flagged: int            # client lag: receive times not vouched for
    worst_lag: tuple[str, int, int, float] | None   # (where, flagged, ok, worst lag ms)
    behind: list[str]                # one line per open-loop target that fell behind
    loadavg: list[float] | None      # the highest 1-min load among the results, with its 5 and 15 min
    cpus: int | None

    @property
    def flagged_share(self) -> float:
        return self.requests_flagged / self.requests_ok if self.requests_ok else 0.0

    @property
    def busy(self) -> bool:
        return bool(self.loadavg and self.cpus and self.loadavg[0] > self.cpus)


def _excluded(splits: list[dict[str, Any]]) -> bool:
    """latency_split leaves lagged requests out of its ttfb/ttft figures (it then counts num_lagged)."""
    return any("num_lagged" in t for r in splits for t in (r.get("data") or {}).get("targets") or [])


def _lag(target: dict[str, Any]) -> tuple[int, int, float]:
    ok = [s for s in target.get("samples") or [] if s.get("ok")]
    lagged = [s for s in ok if s.get("lagged")]
    return len(ok), len(lagged), max((s.get("client_lag_ms") or 0.0 for s in lagged), default=0.0)


def _behind(target: dict[str, Any], where: str) -> str | None:
    ol = target.get("open_loop") or {}
    if not (ol.get("load_generator_behind") or target.get("load_generator_behind")):
        return None
    rate = ""
    got, asked = ol.get("achieved_rate_rps"), ol.get("target_rate_rps") or ol.get("scheduled_rate_rps")
    if got is not None and asked:
        rate = f"achieved {got:.1f} of {asked:g} req/s; "
    lag = ol.get("dispatch_lag_p99_ms")
    lag_txt = f"dispatch lag p99 {lag:.2f} ms; " if lag is not None else ""
    why = ol.get("reason") or target.get("load_generator_reason") or "flagged by latency-split"
    return f"{target.get('name')} at {where}: {rate}{lag_txt}{why}"


def health(splits: list[dict[str, Any]]) -> Health:
    ok = flagged = 0
    worst: tuple[str, int, int, float] | None = None
    behind: list[str] = []
    load: list[float] | None = None
    cpus: int | None = None
    for r in splits:
        d = r.get("data") or {}
        where = config_label(d.get("config") or {})
        for t in d.get("targets") or []:
            n, k, lag = _lag(t)
            ok, flagged = ok + n, flagged + k
            if k and (worst is None or k / n > worst[1] / worst[2]):
                worst = (f"{t.get('name')} at {where}", k, n, lag)
            if (line := _behind(t, where)) is not None:
                behind.append(line)
        env = r.get("environment") or {}
        la = env.get("loadavg") or d.get("loadavg")
        if isinstance(la, list) and la and (load is None or la[0] > load[0]):
            load = [float(x) for x in la]
        cpus = env.get("cpus") or cpus
    return Health(ok, flagged, worst, behind, load, cpus)


def _load_txt(h: Health) -> str:
    if not h.loadavg:
        return "machine load not recorded"
    la = " / ".join(f"{x:.1f}" for x in h.loadavg[:3])
    on = f" on {h.cpus} CPUs" if h.cpus else ""
    return f"machine load {la} (1/5/15 min){on}" + (": busy" if h.busy else "")


def health_lines(splits: list[dict[str, Any]]) -> list[str]:
    """What the headline area must say about the measurement itself (empty: nothing to say)."""
    h = health(splits)
    out = []
    if h.requests_flagged:
        w = h.worst_lag
        worst = (f"; most on {w[0]}: {w[1]} of {w[2]}, up to {w[3]:.2f} ms late" if w else "")
        out.append(f"zgtool's client could not vouch for its receive times on {h.flagged_share:.0%} of requests "
                   f"({h.requests_flagged} of {h.requests_ok}{worst}): "
                   + ("they are left out of the TTFB/TTFT figures; " if _excluded(splits) else
                      "their TTFB/TTFT may be late by that much; ") + f"{_load_txt(h)}.")
    for line in h.behind:
        out.append(f"The load generator fell behind its schedule on {line}: latency counted from actual sends "
                   f"flatters the server; {_load_txt(h)}.")
    if not out and h.busy:
        out.append(f"The machine was busy while measuring ({_load_txt(h)}): expect wider intervals than on a "
                   "quiet machine.")
    return out

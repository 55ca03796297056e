"""One detection for every measuring command: each bare-URL target's API found by asking it, and one model
for all of them: the one the first target serves (a 1-token request with it succeeded), checked on every
other. A target that cannot serve it stops the run before anything is measured (exit 2), naming what
that target lists, so paths never silently measure different models."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from zgtool.errors import UsageError
from zgtool.latency.wire.detect import Detection, check_serves, detect
from zgtool.targets import Target


class ModelNotServed(UsageError):
    """A target of a multi-target run cannot serve the model the first one serves (exit 2)."""


@dataclass(frozen=True)
class Detect:
    """What detection may ask: the API and model are given (skip those), how long to wait, TLS."""

    api_known: bool
    model_known: bool
    timeout_s: float = 10.0
    verify: bool | str = True


def _listing(ids: Sequence[str]) -> str:
    if not ids:
        return "it lists no model (GET /v1/models)"
    head = ", ".join(repr(i) for i in ids[:6])
    return f"it lists {head}{f' and {len(ids) - 6} more' if len(ids) > 6 else ''}"


def _check(t: Target, model: str, first: Target, how: Detect) -> None:
    ok, said, ids = check_serves(t, model, timeout_s=how.timeout_s, verify=how.verify)
    if not ok:
        raise ModelNotServed(f"{t.name} cannot serve model {model!r}, which {first.name} serves (1-token request "
                             f"-> {said}); {_listing(ids)}; pass --model NAME to measure a model every target "
                             "serves")


def detect_targets(targets: Sequence[tuple[Target, bool]], how: Detect) -> list[tuple[Target, Detection | None]]:
    """Each (target, is_bare_url) detected in order. The first served model is the run's: every later bare
    URL is asked for it (its own listing is not consulted) and must serve it, else ModelNotServed; an earlier
    one that served nothing asks for it too (its errors are measured), so no two paths ask for different models."""
    out: list[tuple[Target, Detection | None]] = []
    first: tuple[Target, str] | None = None
    unserved: set[int] = set()          # indexes in `out` of bare URLs detected before any model was served
    for t, bare in targets:
        if not bare or (how.api_known and how.model_known):
            out.append((t, None))
            continue
        if first is None or how.model_known:
            t, found = detect(t, api_known=how.api_known, model_known=how.model_known, timeout_s=how.timeout_s,
                              verify=how.verify)
            if first is None and found is not None and found.served and not how.model_known:
                first = (t, found.model)
                # earlier bare URLs served nothing (their own errors will speak): they ask for this model too
                m = found.model
                out = [(replace(u, model=m), f and replace(f, model=m)) if i in unserved else (u, f)
                       for i, (u, f) in enumerate(out)]
            elif found is None or not found.served:
                unserved.add(len(out))
            out.append((t, found))
            continue
        first_t, model = first
        t, found = detect(replace(t, model=model), api_known=how.api_known, model_known=True,
                          timeout_s=how.timeout_s, verify=how.verify)
        if found is None or not found.served:
            _check(t, model, first_t, how)
        elif found is not None:
            found = replace(found, how=f"{found.how}; the model {first_t.name} serves")
        out.append((t, found))
    return one_api(out, [not bare for _, bare in targets]) if not how.api_known else out


def one_api(out: list[tuple[Target, Detection | None]], fixed: Sequence[bool]) -> list[tuple[Target, Detection | None]]:
    """Paths detected on different APIs (each takes the one its engine's timing shows on) are measured on one API
    that every path answered, so that no two paths send different requests (a gateway's translation of one API
    into the other, or the engine's other front, would count as the hop's cost): the one on which most paths'
    answers carried the engine's timing, the first path's on a tie. A `fixed` path (a config entry: its API is
    not detected) keeps its own, and the others must answer it; a bare URL that answered nothing constrains
    nothing. When no API serves every path they stay as detected."""
    if len({t.api for t, _ in out}) < 2:
        return out
    per_path = [dict(f.answers) if f is not None and f.answers else {t.api: False} if pinned else None
                for (t, f), pinned in zip(out, fixed, strict=True)]
    known = [a for a in per_path if a is not None]
    common = set.intersection(*(set(a) for a in known)) if known else set()
    if not common:
        return out
    first = out[0][0].api
    chosen = max(sorted(common), key=lambda api: (sum(a[api] for a in known), api == first))
    timed = sum(a[chosen] for a in known)
    why = (f"the {chosen} API, which every path answers ({timed} of {len(known)} with the engine's timing), so "
           "that every path sends the same request")
    return [(t, f) if t.api == chosen or a is None else
            (replace(t, api=chosen), f and replace(f, api=chosen, how=f"{f.how}; measured on {why}"))
            for (t, f), a in zip(out, per_path, strict=True)]

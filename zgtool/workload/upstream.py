"""The engine behind a gateway, where the gateway publishes it: LiteLLM's GET /model/info (its proxy's
documented model-info route, also at /v1/model/info) lists each deployment's `litellm_params` without the
keys: `api_base` (the engine's URL) and `model` as PROVIDER/ID (the engine's own id for it), under the
`model_name` clients ask for (a name with `*` is a wildcard that passes the asked name on).

Used to count tokens on the engine's own tokenize route when the gateway has none (zgtool.workload.tokens), to
try the engine's own model names first in detection (zgtool.latency.wire.detect), and to name the command that
measures a gateway's tax beside its engine (latency-split on the gateway alone). The gateway's key is never sent
to the engine: it is a different server."""

from __future__ import annotations

import collections
import fnmatch
import time
from dataclasses import dataclass
from typing import Any

INFO_PATHS = ("/model/info", "/v1/model/info")


@dataclass(frozen=True)
class Upstream:
    base: str      # the engine's URL before /v1
    model: str     # the engine's id for the model asked
    via: str       # where it was read, in words


def strip_v1(url: str) -> str:
    url = url.rstrip("/")
    return url[:-3] if url.endswith("/v1") else url


def _engine_model(params: dict[str, Any], asked: str) -> str | None:
    name = params.get("model")
    if not isinstance(name, str) or not name:
        return None
    ident = name.split("/", 1)[1] if "/" in name else name
    return asked if "*" in ident else ident


def upstreams_in(doc: Any, asked: str, via: str) -> list[Upstream]:
    """The deployments serving `asked` in a /model/info answer (exact names first, then wildcards) that name
    an http(s) api_base; [] for any other shape."""
    rows = doc.get("data") if isinstance(doc, dict) else None
    if not isinstance(rows, list):
        return []
    exact: list[Upstream] = []
    wild: list[Upstream] = []
    for row in rows:
        if not isinstance(row, dict) or not isinstance(row.get("litellm_params"), dict):
            continue
        name, params = row.get("model_name"), row["litellm_params"]
        base, ident = params.get("api_base"), _engine_model(params, asked)
        if not isinstance(name, str) or not isinstance(base, str) or ident is None \
                or not base.startswith(("http://", "https://")):
            continue
        if name == asked:
            exact.append(Upstream(strip_v1(base), ident, via))
        elif "*" in name and fnmatch.fnmatchcase(asked, name):
            wild.append(Upstream(strip_v1(base), ident, via))
    return list(dict.fromkeys(exact + wild))


# base -> (when asked, (its /model/info answer, where) or None): asked once while a run detects, counts and
# measures (LiteLLM's answer can be 2 MB), and again after INFO_TTL_S (another server may hold the port by then)
_INFO: dict[str, tuple[float, tuple[Any, str] | None]] = {}
INFO_TTL_S = 30.0


def _info(client: Any, base: str, headers: dict[str, str] | None = None) -> tuple[Any, str] | None:
    import httpx

    seen = _INFO.get(base)
    if seen is not None and time.monotonic() - seen[0] < INFO_TTL_S:
        return seen[1]
    found: tuple[Any, str] | None = None
    for path in INFO_PATHS:
        try:
            r = client.get(base + path, headers=headers or {})
            doc = r.json() if r.status_code == 200 else None
        except (httpx.HTTPError, ValueError):
            continue
        if isinstance(doc, dict) and isinstance(doc.get("data"), list):
            found = (doc, f"GET {path} at {base}")
            break
    _INFO[base] = (time.monotonic(), found)
    return found


def published_upstreams(client: Any, base: str, asked: str, headers: dict[str, str] | None = None) -> list[Upstream]:
    """What the gateway at `base` (before /v1) publishes as the engines behind model `asked`; [] when it
    publishes nothing (not LiteLLM, the route refused, or no api_base for that model)."""
    got = _info(client, base, headers)
    return upstreams_in(got[0], asked, got[1]) if got is not None else []


def engine_models(client: Any, base: str, headers: dict[str, str] | None = None, *, verify: bool | str = True,
                  timeout_s: float = 10.0) -> tuple[list[str], bool, str] | None:
    """The model ids the first engine the gateway at `base` publishes lists on its own GET /v1/models (asked
    without the gateway's key), whether a wildcard route of the gateway passes any name on to it, and where that
    was read; None when the gateway publishes no engine that answers."""
    import httpx

    got = _info(client, base, headers)
    listed = [r for r in (got[0]["data"] if got is not None else []) if isinstance(r, dict)]
    # LiteLLM lists a wildcard deployment once per OpenAI id it knows, every row with the deployment's one id
    deployment = [str(r["model_info"].get("id")) if isinstance(r.get("model_info"), dict) else None for r in listed]
    rows_of = collections.Counter(d for d in deployment if d is not None)
    engines: dict[str, bool] = {}
    for row, dep in zip(listed, deployment, strict=True):
        params = row.get("litellm_params")
        api_base = params.get("api_base") if isinstance(params, dict) else None
        if isinstance(api_base, str) and api_base.startswith(("http://", "https://")):
            wild = "*" in str(row.get("model_name") or "") or (dep is not None and rows_of[dep] > 1)
            engines[strip_v1(api_base)] = engines.get(strip_v1(api_base), False) or wild
    for engine, wild in engines.items():
        try:         # a client of its own: the gateway's key is not the engine's
            doc = httpx.get(engine + "/v1/models", timeout=timeout_s, verify=verify, trust_env=False).json()
        except (httpx.HTTPError, ValueError):
            continue
        rows = doc.get("data") if isinstance(doc, dict) else None
        ids = [d["id"] for d in rows or [] if isinstance(d, dict) and isinstance(d.get("id"), str) and d["id"]]
        if ids:
            assert got is not None
            return ids, wild, f"the engine behind it, {engine} ({got[1]})"
    return None


def tax_hint(url: str, model: str, headers: dict[str, str], *, verify: bool | str, timeout_s: float) -> str | None:
    """For a run of one target that is a gateway publishing its engine: the command that measures the gateway's
    tax beside that engine, in words; None otherwise."""
    import httpx

    base = strip_v1(url)
    with httpx.Client(timeout=timeout_s, verify=verify, trust_env=False, headers=headers) as client:
        ups = published_upstreams(client, base, model)
    if not ups:
        return None
    engine = ups[0].base + "/v1"
    return (f"{url} is a gateway that publishes the engine behind {model!r}: {engine} ({ups[0].via}); "
            f"`zgtool latency-split {engine} {url}` measures the gateway's tax beside it, paired request by request")

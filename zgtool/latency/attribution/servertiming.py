"""Server-Timing (header, via zgtool.probes.servertiming) and the engine's SSE timing event -> {name: ms}."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

from zgtool.probes.servertiming import parse_server_timing

TIMING_KEYS = ("server_timing", "zgtool_timing", "timings", "timing")
# LiteLLM forwards the upstream's Server-Timing renamed; its values are the engine's own
PROVIDER_TIMING_HEADERS = ("llm_provider-server-timing",)
# gateways that state their own overhead in a header of their own: header -> gateway part (ms)
GATEWAY_OVERHEAD_HEADERS = {"x-litellm-overhead-duration-ms": "gw_litellm_overhead"}


def server_timing_ms(values: str | Iterable[str]) -> dict[str, float]:
    """Header values -> {name: dur ms}. Metrics without a usable dur carry no time and are dropped.

    A repeated name keeps its first occurrence: the origin's value, which a gateway appending
    its own gw_* parts passes through first.
    """
    vals = [values] if isinstance(values, str) else list(values)
    out: dict[str, float] = {}
    for m in parse_server_timing(vals):
        if m.dur_ms is not None and m.dur_ms == m.dur_ms and m.dur_ms >= 0:
            out.setdefault(m.name, float(m.dur_ms))
    return out


def timing_from_headers(headers: Iterable[tuple[bytes | str, bytes | str]]) -> dict[str, float]:
    """Every timing a response's headers carry -> {name: ms}.

    `Server-Timing` first; a renamed copy of the engine's header (LiteLLM's
    `llm_provider-server-timing`) supplies the engine's parts when the plain header lacks them,
    and a gateway's overhead header (`x-litellm-overhead-duration-ms`) becomes a gw_* part.
    """
    plain: list[str] = []
    provider: list[str] = []
    overhead: dict[str, float] = {}
    for k, v in headers:
        name = (k.decode("latin-1") if isinstance(k, bytes) else k).lower()
        value = v.decode("latin-1") if isinstance(v, bytes) else v
        if name == "server-timing":
            plain.append(value)
        elif name in PROVIDER_TIMING_HEADERS:
            provider.append(value)
        elif name in GATEWAY_OVERHEAD_HEADERS:
            try:
                ms = float(value.strip())
            except ValueError:
                continue
            if ms >= 0 and ms == ms:
                overhead[GATEWAY_OVERHEAD_HEADERS[name]] = ms
    out = server_timing_ms(plain)
    if provider:
        engine = server_timing_ms(provider)
        if "total" not in out:
            out = {**engine, **{k: v for k, v in out.items() if k not in engine}}
    for part, ms_value in overhead.items():
        out.setdefault(part, ms_value)
    return out


def _numbers(obj: Mapping[str, Any]) -> dict[str, float]:
    out: dict[str, float] = {}
    for name, dur in obj.items():
        if isinstance(dur, int | float) and not isinstance(dur, bool) and dur >= 0 and dur == dur:
            out[str(name).removesuffix("_ms")] = float(dur)
    return out


def parse_timing_event(data: str | bytes | Mapping[str, Any]) -> dict[str, float]:
    """The engine's per-request timing event (SSE `zgtool_timing`) -> {name: ms}.

    Accepts a Server-Timing string or a {name: ms} mapping under one of TIMING_KEYS, or the
    numbers at the top level (`{"type": "zgtool_timing", "queue_ms": 1.0, ...}`); a `_ms`
    suffix is dropped so names match the header's.
    """
    if isinstance(data, str | bytes):
        try:
            data = json.loads(data)
        except (json.JSONDecodeError, UnicodeDecodeError):
            return {}
    if not isinstance(data, Mapping):
        return {}
    for key in TIMING_KEYS:
        val = data.get(key)
        if isinstance(val, str):
            return server_timing_ms(val)
        if isinstance(val, Mapping):
            return parse_timing_event(val) if any(k in val for k in TIMING_KEYS) else _numbers(val)
    return _numbers(data)

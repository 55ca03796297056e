"""Views over a ResultSet that several sections share: probes per path, split configs, stage reasons."""

from __future__ import annotations

from typing import Any

from zgtool.report.load import ResultSet

PROBES = ("tcp", "tls", "headers", "stream")


def path_name(result: dict[str, Any]) -> str:
    t = result.get("target")
    if isinstance(t, dict):
        return str(t.get("name") or t.get("url") or "?")
    data = result.get("data") or {}
    return str(data.get("url") or data.get("target_url") or data.get("source") or "?")


def probes_by_path(rs: ResultSet) -> dict[str, dict[str, Any]]:
    """path -> {tcp, tls, headers, stream, errors, skipped}: from probe.all and single probe.* results."""
    out: dict[str, dict[str, Any]] = {}
    for r in rs.of("probe.all"):
        d = r.get("data") or {}
        entry = out.setdefault(path_name(r), {})
        for p in PROBES:
            if d.get(p) is not None:
                entry[p] = d[p]
        entry.setdefault("errors", {}).update(d.get("errors") or {})
        entry.setdefault("skipped", {}).update(d.get("skipped") or {})
    for p in PROBES:
        for r in rs.of(f"probe.{p}"):
            out.setdefault(path_name(r), {})[p] = r.get("data") or {}
    return out


def splits(rs: ResultSet) -> list[dict[str, Any]]:
    """latency_split results ordered non-stream before stream, then by concurrency."""
    found = rs.of("latency_split")

    def key(r: dict[str, Any]) -> tuple[int, int]:
        cfg = (r.get("data") or {}).get("config") or {}
        return int(cfg.get("concurrency", 1)), int(bool(cfg.get("stream")))

    return sorted(found, key=key)


def stage_reasons(rs: ResultSet) -> dict[str, str]:
    """From a verify result: stage name -> why it was skipped or failed (for "section missing" notes)."""
    v = rs.first("verify")
    if v is None:
        return {}
    return {s["name"]: f"{s['status']}: {s.get('reason')}" for s in (v.get("data") or {}).get("stages") or []
            if s.get("status") in ("skipped", "failed", "interrupted")}


def ok_samples(target: dict[str, Any]) -> list[dict[str, Any]]:
    return [s for s in target.get("samples") or [] if s.get("ok")]


def phase_p(target: dict[str, Any], phase: str, stat: str = "p50") -> float | None:
    p = (target.get("phases") or {}).get(phase)
    return None if not p else (p.get("summary") or {}).get(stat)


# Field names that reach a reader get words; anything not listed is de-snaked, never shown raw.
LABELS = {
    "http_req_duration": "request duration", "http_req_blocked": "blocked (waiting for a connection)",
    "http_req_connecting": "connecting", "http_req_sending": "sending", "http_req_waiting": "waiting (TTFB)",
    "http_req_receiving": "receiving", "kv_util": "KV cache use", "kv_util_pct": "KV cache use %",
    "running": "running", "waiting": "waiting", "batch_size": "batch size", "cap_factor": "admission cap factor",
    "gpu_util_pct": "GPU util %", "mem_copy_util_pct": "memory copy util %", "fb_used_pct": "framebuffer used %",
    "power_w": "power W", "sm_clock_mhz": "SM clock MHz", "sm_util": "SM util", "vram_free_gb": "free VRAM GB",
    "kv_blocks_total": "KV blocks (total)", "kv_blocks_used": "KV blocks used", "kv_blocks_free": "KV blocks free",
    "kv_blocks_cached": "KV blocks cached", "block_size": "block size (tokens)",
    "kv_bytes_per_block": "bytes per KV block", "fragmentation": "fragmentation", "device": "device",
    "prefix_cache_queries": "prefix-cache queries", "prefix_cache_hits": "prefix-cache hits",
    "prefix_cache_hit_rate": "prefix-cache hit rate", "requests_ok": "requests ok",
    "generation_tokens": "generated tokens", "prompt_tokens": "prompt tokens",
    "direct_stream": "direct (stream)",
}


def human(name: str) -> str:
    """A field name as a reader should see it: `decode_ms` -> `engine decode`, `kv_util` -> `KV cache use`."""
    from zgtool.latency.render.split import LABELS as PHASES
    from zgtool.latency.render.split import label

    if name in LABELS:
        return LABELS[name]
    if name in PHASES or name.startswith("gw_") and name.endswith("_ms"):
        return label(name)
    if name.endswith("_ms"):
        return name[:-3].replace("_", " ") + " ms"
    return name.replace("_", " ")


def human_value(v: Any) -> str:
    """A value for human eyes: dicts as `label value` pairs, never a Python repr or None."""
    if v is None:
        return "–"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        from zgtool.report.svg import fmt

        return fmt(v)
    if isinstance(v, dict):
        return ", ".join(f"{human(str(k))} {human_value(x)}" for k, x in v.items())
    if isinstance(v, list | tuple):
        return ", ".join(human_value(x) for x in v)
    return str(v)


def path_order(rs: ResultSet) -> tuple[list[str], dict[str, str]]:
    """Every path the report names, direct first, and aliases (k6's `gateway` scenario is the
    gateway path the other results name): each gets one colour in every section."""
    names: list[str] = []
    for r in splits(rs):
        names += [str(t.get("name")) for t in (r.get("data") or {}).get("targets") or []]
    names += list(probes_by_path(rs))
    k6 = [n for r in rs.of("bench.k6") for n in ((r.get("data") or {}).get("scenarios") or {})]
    ordered = sorted(dict.fromkeys(names), key=lambda n: n != "direct")
    gateways = [n for n in ordered if n != "direct"]
    aliases = {"gateway": gateways[0]} if gateways and "gateway" not in ordered else {}
    ordered += [n for n in k6 if n not in ordered and n not in aliases and not n.endswith("_stream")]
    return ordered, aliases

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

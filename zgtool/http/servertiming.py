"""Server-Timing writer: ``name;dur=1.234`` metrics joined by ", " (parsing lives in
zgtool.probes.servertiming)."""

from __future__ import annotations

from collections.abc import Mapping


def server_timing(parts: Mapping[str, float], desc: Mapping[str, str] | None = None) -> str:
    """{name: ms} -> header value; ``desc`` adds ``;desc="..."`` to the named metrics."""
    out = []
    for name, ms in parts.items():
        item = f"{name};dur={ms:.3f}"
        if desc and name in desc:
            item += f';desc="{desc[name]}"'
        out.append(item)
    return ", ".join(out)

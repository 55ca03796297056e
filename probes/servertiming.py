"""Parse `Server-Timing` per the W3C processing rules (w3c/server-timing).

Several headers and repeated metric names are allowed; order carries no meaning;
unknown parameters are ignored; only the first occurrence of a parameter counts;
a `dur` that does not parse becomes 0 (a missing one is None here, so "not sent"
stays distinguishable from "0 ms").
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")


@dataclass(frozen=True)
class Metric:
    name: str
    dur_ms: float | None
    desc: str | None


def _skip_ows(s: str, i: int) -> int:
    while i < len(s) and s[i] in " \t":
        i += 1
    return i


def _quoted(s: str, i: int) -> tuple[str, int]:
    """s[i] == '"': the unescaped string and the index after the closing quote."""
    out, i = [], i + 1
    while i < len(s):
        ch = s[i]
        if ch == "\\" and i + 1 < len(s):
            out.append(s[i + 1])
            i += 2
            continue
        if ch == '"':
            return "".join(out), i + 1
        out.append(ch)
        i += 1
    return "".join(out), i


def _parse_one(s: str) -> list[Metric]:
    metrics: list[Metric] = []
    i = 0
    while i < len(s):
        i = _skip_ows(s, i)
        m = _TOKEN.match(s, i)
        if not m:
            # junk: skip to the next metric
            nxt = s.find(",", i)
            if nxt < 0:
                break
            i = nxt + 1
            continue
        name, i = m.group(0), m.end()
        params: dict[str, str] = {}
        while True:
            i = _skip_ows(s, i)
            if i >= len(s) or s[i] != ";":
                break
            i = _skip_ows(s, i + 1)
            pm = _TOKEN.match(s, i)
            if not pm:
                break
            pname, i = pm.group(0).lower(), pm.end()
            i = _skip_ows(s, i)
            value = ""
            if i < len(s) and s[i] == "=":
                i = _skip_ows(s, i + 1)
                if i < len(s) and s[i] == '"':
                    value, i = _quoted(s, i)
                else:
                    vm = _TOKEN.match(s, i)
                    if vm:
                        value, i = vm.group(0), vm.end()
            params.setdefault(pname, value)
        # anything up to the next comma is junk for this metric
        nxt = s.find(",", i)
        i = len(s) if nxt < 0 else nxt + 1
        dur: float | None = None
        if "dur" in params:
            try:
                dur = float(params["dur"])
            except ValueError:
                dur = 0.0
        metrics.append(Metric(name, dur, params.get("desc")))
    return metrics


def parse_server_timing(values: str | list[str]) -> list[Metric]:
    """Every metric from one or several Server-Timing values, in wire order."""
    if isinstance(values, str):
        values = [values]
    out: list[Metric] = []
    for v in values:
        out += _parse_one(v)
    return out

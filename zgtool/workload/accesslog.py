"""A gateway's own access log, read (issue 39 item 5): as a workload (`--dataset access-log:FORMAT:PATH`, each
request's arrival time and size replayed open-loop) and as a witness of the hop (`latency-split --from-log`,
zgtool.latency.attribution.fromlog: the gateway's logged times beside zgtool's measured ones).

Formats (FORMAT):
  nginx    `combined` plus timing fields after it, positional or key=value:
             ... "$http_user_agent" $request_time $upstream_response_time [$request_length] ["$request_id"]
             ... "$http_user_agent" rt=$request_time urt="$upstream_response_time" [rl=$request_length]
           nginx writes the line when the request ends and $time_local has whole seconds: the N requests
           that ended within one second are spread evenly over it (the k-th at +(k+0.5)/N s, in log order)
           and each arrival is that end less its $request_time. Several upstreams ("0.010, 0.020") are summed.
  envoy    Envoy's default access log, JSON (one object a line; Envoy Gateway's default keys: start_time,
           duration, x-envoy-upstream-service-time, bytes_received, bytes_sent, response_code, x-request-id,
           method, x-envoy-origin-path) or its default text format ([%START_TIME%] "%REQ(:METHOD)% ...").
           %START_TIME% has milliseconds; the upstream service time runs to the upstream's response headers.
  litellm  LiteLLM's spend logs (the LiteLLM_SpendLogs rows, as GET /spend/logs returns them: a JSON array or
           one object a line): request_id, startTime, endTime, prompt_tokens, completion_tokens, status.
           endTime - startTime is LiteLLM's call to the model provider (its upstream time).

A line that does not parse is skipped and counted, the first such line number kept; a line that parses but is
not an LLM request (not a POST) is left out and counted apart. A file with no usable line is an error.
"""

from __future__ import annotations

import datetime as dt
import json
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from zgtool.errors import UsageError

FORMATS = ("nginx", "envoy", "litellm")


@dataclass(frozen=True)
class LogEntry:
    line: int
    start_s: float                        # arrival, Unix seconds
    method: str | None = None
    path: str | None = None
    status: int | None = None
    request_bytes: int | None = None
    response_bytes: int | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    total_ms: float | None = None         # the gateway's own time for the request
    upstream_ms: float | None = None      # its logged upstream time
    request_id: str | None = None         # as logged; a W3C traceparent is reduced to its trace id
    end_second: int | None = None         # nginx: the whole second $time_local names (the line's end)


@dataclass(frozen=True)
class AccessLog:
    format: str
    path: Path
    entries: tuple[LogEntry, ...]
    skipped: int = 0                      # lines that did not parse
    first_bad_line: int | None = None
    first_bad_why: str | None = None
    not_llm: int = 0                      # parsed, but not an LLM request (GET /health ...)
    notes: tuple[str, ...] = field(default_factory=tuple)

    def skipped_note(self) -> str | None:
        if not self.skipped:
            return None
        return (f"{self.skipped} malformed line(s) skipped (first: line {self.first_bad_line}: {self.first_bad_why})")


class _Bad(ValueError):
    """One line that does not parse: why."""


_TRACEPARENT = re.compile(r"^[0-9a-f]{2}-([0-9a-f]{32})-[0-9a-f]{16}-[0-9a-f]{2}$")


def request_id(value: str | None) -> str | None:
    if value in (None, "", "-"):
        return None
    m = _TRACEPARENT.match(value)
    return m.group(1) if m else value


def _num(v: Any, what: str) -> float | None:
    if v in (None, "", "-"):
        return None
    try:
        return float(v)
    except (TypeError, ValueError):
        raise _Bad(f"{what} is not a number: {v!r}") from None


def _int(v: Any, what: str) -> int | None:
    f = _num(v, what)
    return None if f is None else int(f)


# -- nginx -------------------------------------------------------------------------------------------------
_COMBINED = re.compile(r'^(\S+) \S+ (\S+) \[([^\]]+)\] "([^"]*)" (\d{3}) (\d+|-) "([^"]*)" "([^"]*)"(.*)$')


def _upstream_s(value: str) -> float | None:
    """$upstream_response_time: '0.010', '-', or several upstreams '0.010, 0.020' / redirects '0.01 : 0.02'."""
    parts = [p for p in re.split(r"[,:]\s*", value.strip()) if p.strip()]
    vals = [_num(p.strip(), "$upstream_response_time") for p in parts]
    known = [v for v in vals if v is not None]
    return sum(known) if known else None


def _nginx_trailer(trail: str) -> dict[str, str]:
    """The fields after combined's user agent: positional (request_time upstream_time [length] ["id"]) or key=value."""
    try:
        tokens = shlex.split(re.sub(r",\s+", ",", re.sub(r"\s+:\s+", ":", trail)))
    except ValueError as exc:
        raise _Bad(f"timing fields: {exc}") from None
    out: dict[str, str] = {}
    keys = {"rt": "request_time", "request_time": "request_time", "urt": "upstream", "upstream_response_time":
            "upstream", "rl": "request_length", "request_length": "request_length", "rid": "id", "request_id": "id",
            "traceparent": "id"}
    positional = ["request_time", "upstream", "request_length", "id"]
    for tok in tokens:
        key, sep, value = tok.partition("=")
        if sep and key in keys:
            out[keys[key]] = value
        elif not sep or not key.isidentifier():
            while positional and positional[0] in out:
                positional.pop(0)
            if positional:
                name = positional.pop(0)
                if name == "request_length" and not tok.isdigit():   # no length logged: this is the id
                    name = "id"
                out[name] = tok
    return out


def parse_nginx(line: str, number: int) -> LogEntry:
    m = _COMBINED.match(line)
    if m is None:
        raise _Bad("not nginx's combined format")
    try:
        end = dt.datetime.strptime(m.group(3), "%d/%b/%Y:%H:%M:%S %z").timestamp()
    except ValueError:
        raise _Bad(f"time {m.group(3)!r} is not $time_local") from None
    req = m.group(4).split()
    trail = _nginx_trailer(m.group(9))
    rt = _num(trail.get("request_time"), "$request_time")
    if rt is None:
        raise _Bad("no $request_time after the combined fields")
    ups = _upstream_s(trail["upstream"]) if "upstream" in trail else None
    return LogEntry(number, end - rt, req[0] if req else None, req[1] if len(req) > 1 else None, int(m.group(5)),
                    _int(trail.get("request_length"), "$request_length"), _int(m.group(6), "$body_bytes_sent"),
                    total_ms=rt * 1e3, upstream_ms=None if ups is None else ups * 1e3,
                    request_id=request_id(trail.get("id")), end_second=int(end))


def _spread_within_seconds(entries: list[LogEntry]) -> list[LogEntry]:
    """nginx's whole-second ends spread evenly over their second (see the module's docstring)."""
    from dataclasses import replace

    by_second: dict[int, list[LogEntry]] = {}
    for e in entries:
        by_second.setdefault(e.end_second or 0, []).append(e)
    out = []
    for second, group in by_second.items():
        n = len(group)
        out += [replace(e, start_s=second + (k + 0.5) / n - (e.total_ms or 0.0) / 1e3) for k, e in enumerate(group)]
    return out


# -- envoy -------------------------------------------------------------------------------------------------
_ENVOY_TEXT = re.compile(r'^\[([^\]]+)\] "(\S+) (\S+) (\S+)" (\d+|-) (\S+) (\d+|-) (\d+|-) (\d+|-) (\S+) '
                         r'"([^"]*)" "([^"]*)" "([^"]*)"')


def _iso(value: Any, what: str) -> float:
    if not isinstance(value, str):
        raise _Bad(f"{what} missing")
    try:
        t = dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise _Bad(f"{what} {value!r} is not an ISO 8601 time") from None
    return (t if t.tzinfo else t.replace(tzinfo=dt.UTC)).timestamp()


def parse_envoy(line: str, number: int) -> LogEntry:
    if line.lstrip().startswith("{"):
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise _Bad(f"not JSON ({exc.msg})") from None
        if not isinstance(row, dict):
            raise _Bad("not a JSON object")
        up = row.get("x-envoy-upstream-service-time", row.get("upstream_service_time"))
        return LogEntry(number, _iso(row.get("start_time"), "start_time"), row.get("method"),
                        row.get("x-envoy-origin-path") or row.get("path"), _int(row.get("response_code"), "response_code"),
                        _int(row.get("bytes_received"), "bytes_received"), _int(row.get("bytes_sent"), "bytes_sent"),
                        total_ms=_num(row.get("duration"), "duration"), upstream_ms=_num(up, "upstream service time"),
                        request_id=request_id(row.get("x-request-id") or row.get("request_id")))
    m = _ENVOY_TEXT.match(line)
    if m is None:
        raise _Bad("neither Envoy's default JSON nor its default text format")
    return LogEntry(number, _iso(m.group(1), "%START_TIME%"), m.group(2), m.group(3), _int(m.group(5), "%RESPONSE_CODE%"),
                    _int(m.group(7), "%BYTES_RECEIVED%"), _int(m.group(8), "%BYTES_SENT%"),
                    total_ms=_num(m.group(9), "%DURATION%"), upstream_ms=_num(m.group(10), "upstream service time"),
                    request_id=request_id(m.group(13)))


# -- litellm -----------------------------------------------------------------------------------------------
def parse_litellm(row: Any, number: int) -> LogEntry:
    if not isinstance(row, dict):
        raise _Bad("not a spend-log object")
    start = _iso(row.get("startTime"), "startTime")
    end = _iso(row.get("endTime"), "endTime") if row.get("endTime") else None
    status = row.get("status")
    return LogEntry(number, start, "POST", row.get("call_type"), 200 if status in (None, "success") else 500,
                    prompt_tokens=_int(row.get("prompt_tokens"), "prompt_tokens"),
                    completion_tokens=_int(row.get("completion_tokens"), "completion_tokens"),
                    upstream_ms=None if end is None else (end - start) * 1e3,
                    request_id=request_id(row.get("request_id")))


def _litellm_rows(text: str) -> list[tuple[int, Any, str | None]]:
    """(line, row, why-not) of a JSON array (GET /spend/logs) or of one object a line."""
    stripped = text.lstrip()
    if stripped.startswith("["):
        try:
            rows = json.loads(stripped)
        except json.JSONDecodeError as exc:
            return [(exc.lineno, None, f"not JSON ({exc.msg})")]
        return [(i + 1, r, None) for i, r in enumerate(rows)] if isinstance(rows, list) else [(1, None, "not a list")]
    out: list[tuple[int, Any, str | None]] = []
    for i, line in enumerate(text.splitlines(), 1):
        if line.strip():
            try:
                out.append((i, json.loads(line), None))
            except json.JSONDecodeError as exc:
                out.append((i, None, f"not JSON ({exc.msg})"))
    return out


def read(fmt: str, path: Path) -> AccessLog:
    """The log's usable entries in arrival order; UsageError (exit 2) when unreadable or none is usable."""
    if fmt not in FORMATS:
        raise UsageError(f"access log format {fmt!r}: choose {', '.join(FORMATS)}")
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError as exc:
        raise UsageError(f"cannot read access log {path}: {exc.strerror or exc}") from None
    if fmt == "litellm":
        items: list[tuple[int, Any, str | None]] = _litellm_rows(text)
    else:
        items = [(i, line, None) for i, line in enumerate(text.splitlines(), 1) if line.strip()]
    entries: list[LogEntry] = []
    skipped, first, why, not_llm = 0, None, None, 0
    for number, item, err in items:
        try:
            if err is not None:
                raise _Bad(err)
            e = (parse_litellm(item, number) if fmt == "litellm"
                 else parse_nginx(item, number) if fmt == "nginx" else parse_envoy(item, number))
        except _Bad as exc:
            skipped += 1
            if first is None:
                first, why = number, str(exc)
            continue
        if (e.method or "").upper() != "POST":
            not_llm += 1
            continue
        entries.append(e)
    if fmt == "nginx":
        entries = _spread_within_seconds(entries)
    log = AccessLog(fmt, path, tuple(sorted(entries, key=lambda e: e.start_s)), skipped, first, why, not_llm)
    if not entries:
        detail = log.skipped_note() or "no line at all"
        raise UsageError(f"access log {path} ({fmt}): no usable request in it ({detail}"
                         + (f"; {not_llm} non-POST line(s) left out" if not_llm else "") + "); nothing was sent")
    return log

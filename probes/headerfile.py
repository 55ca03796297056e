"""`probe headers --read FILE`: analyse responses someone already recorded, without a network.

Formats (detected from the content):
  * HAR (a browser's "Save all as HAR"): log.entries[].response.{status, httpVersion, headers[{name, value}],
    content.text}; HTTP/2 pseudo-headers (":status") are skipped;
  * `curl -v` output: response lines prefixed "< ", the request's "> METHOD PATH" and "> Host:" name it;
  * `curl -sD-` / `curl -i` output and raw header text: a status line "HTTP/x[.y] NNN ..." starts each
    response, header lines follow up to a blank line, then the body; header lines with no status
    line at all are one response of unknown status.
Every response in the file is analysed on its own (signatures, hop evidence from re-cased
headers; the error probe needs a live target and is not run).

Data (kind "probe.headers", mode "read"): source, format, responses [{index, label, url, status,
http_version, headers, body_excerpt, analysis}], notes.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from zgtool.errors import UsageError
from zgtool.probes.headers import HeaderAnalysis, analyse_headers
from zgtool.probes.hopevidence import assess

STATUS_LINE = re.compile(r"^(HTTP/\d(?:\.\d)?)\s+(\d{3})\b(.*)$")
HEADER_LINE = re.compile(r"^([!#$%&'*+.^_`|~0-9A-Za-z-]+):[ \t]*(.*)$")
MAX_FILE_BYTES = 64 * 1024 * 1024


@dataclass
class Recorded:
    label: str
    url: str | None
    status: int | None
    http_version: str | None
    headers: list[tuple[str, str]]
    body: str = ""


@dataclass
class RecordedResponse:
    index: int
    label: str
    url: str | None
    status: int | None
    http_version: str | None
    headers: list[tuple[str, str]]
    body_excerpt: str
    analysis: HeaderAnalysis


@dataclass
class HeadersReadResult:
    source: str
    format: str                  # har | curl-v | http (curl -sD- / raw)
    responses: list[RecordedResponse]
    mode: str = "read"
    notes: list[str] = field(default_factory=list)


def read_headers_file(path: str | Path) -> HeadersReadResult:
    p = Path(path)
    if not p.is_file():
        raise UsageError(f"headers file not found: {p}")
    if p.stat().st_size > MAX_FILE_BYTES:
        raise UsageError(f"{p} is over {MAX_FILE_BYTES // 2**20} MiB; export fewer responses")
    text = p.read_bytes().decode("utf-8", "replace")
    if not text.strip():
        raise UsageError(f"{p} is empty")
    notes: list[str] = []
    if text.lstrip().startswith("{"):
        fmt, recorded = "har", _har(text, p, notes)
    elif any(line.startswith("< ") or line.rstrip("\r") == "<" for line in text.splitlines()):
        fmt, recorded = "curl-v", _curl_verbose(text)
    else:
        fmt, recorded = "http", _http_text(text)
    if not recorded:
        raise UsageError(f"{p}: no HTTP response headers found (expected a HAR file, `curl -sD-` or `curl -v` "
                         "output, or raw header lines)")
    responses = []
    for i, r in enumerate(recorded):
        a = analyse_headers(r.headers, r.body)
        hop = assess(a, r.headers, None, None)
        a.verdict, a.verdict_summary, a.hop_evidence = hop.verdict, hop.summary, hop.evidence
        responses.append(RecordedResponse(i, r.label, r.url, r.status, r.http_version, r.headers, r.body[:500], a))
    notes.append("recorded responses: the error probe (who answers a malformed request) needs a live target; "
                 "run `zgtool probe headers URL` for it")
    return HeadersReadResult(str(p), fmt, responses, notes=notes)


def _har(text: str, p: Path, notes: list[str]) -> list[Recorded]:
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise UsageError(f"{p} is not valid JSON ({exc.msg} at line {exc.lineno}, column {exc.colno})") from exc
    entries = doc.get("log", {}).get("entries") if isinstance(doc, dict) and isinstance(doc.get("log"), dict) else None
    if not isinstance(entries, list):
        raise UsageError(f"{p} is JSON but not a HAR file (no log.entries list)")
    out: list[Recorded] = []
    skipped = 0
    for i, e in enumerate(entries):
        resp = e.get("response") if isinstance(e, dict) else None
        req = e.get("request", {}) if isinstance(e, dict) else {}
        if not isinstance(resp, dict) or not isinstance(resp.get("headers"), list) or not resp.get("status"):
            skipped += 1  # blocked, cancelled or failed requests carry status 0 and no headers
            continue
        headers = [(str(h.get("name", "")), str(h.get("value", ""))) for h in resp["headers"]
                   if isinstance(h, dict) and h.get("name") and not str(h["name"]).startswith(":")]
        content: Any = resp.get("content") or {}
        body = content.get("text", "") if isinstance(content, dict) and content.get("encoding") != "base64" else ""
        url = req.get("url") if isinstance(req, dict) else None
        method = req.get("method", "") if isinstance(req, dict) else ""
        out.append(Recorded(f"entry {i}: {method} {url}".strip(), url, int(resp["status"]),
                            resp.get("httpVersion") or None, headers, str(body or "")))
    if skipped:
        notes.append(f"{skipped} HAR entr{'y' if skipped == 1 else 'ies'} without a response (status 0) skipped")
    return out


def _curl_verbose(text: str) -> list[Recorded]:
    out: list[Recorded] = []
    method_path: str | None = None
    host: str | None = None
    cur: Recorded | None = None
    in_head = False
    body: list[str] = []

    def close() -> None:
        if cur is not None:
            cur.body = "\n".join(body).strip()
            out.append(cur)

    for raw in text.splitlines():
        line = raw.rstrip("\r")
        if line.startswith("> ") or line == ">":
            req = line[2:]
            if re.match(r"^[A-Z]+ \S+ HTTP/", req):
                method_path = " ".join(req.split()[:2])
                host = None
            elif req.lower().startswith("host:"):
                host = req.split(":", 1)[1].strip()
            continue
        if line.startswith("< ") or line == "<":
            resp = line[2:]
            m = STATUS_LINE.match(resp)
            if m:
                close()
                body = []
                url = f"{host}{method_path.split(' ', 1)[1]}" if host and method_path else None
                label = f"response {len(out)}" + (f": {method_path.split(' ')[0]} {url}" if url and method_path else "")
                cur = Recorded(label, url, int(m.group(2)), m.group(1)[5:], [])
                in_head = True
            elif cur is not None and in_head:
                h = HEADER_LINE.match(resp)
                if h:
                    cur.headers.append((h.group(1), h.group(2).strip()))
                elif not resp.strip():
                    in_head = False
            continue
        if line.startswith(("* ", "{ ", "} ")) or line == "*":
            continue
        if cur is not None and not in_head:
            body.append(line)
    close()
    return out


def _http_text(text: str) -> list[Recorded]:
    out: list[Recorded] = []
    lines = [line.rstrip("\r") for line in text.splitlines()]
    starts = [i for i, line in enumerate(lines) if STATUS_LINE.match(line)]
    if not starts:  # bare header lines: one response of unknown status
        bare = [(m.group(1), m.group(2).strip()) for m in map(HEADER_LINE.match, lines) if m]
        return [Recorded("response 0 (no status line)", None, None, None, bare)] if bare else []
    for n, start in enumerate(starts):
        end = starts[n + 1] if n + 1 < len(starts) else len(lines)
        m = STATUS_LINE.match(lines[start])
        assert m is not None
        headers: list[tuple[str, str]] = []
        i = start + 1
        while i < end and lines[i].strip():
            h = HEADER_LINE.match(lines[i])
            if h:
                headers.append((h.group(1), h.group(2).strip()))
            elif lines[i][:1] in " \t" and headers:  # obsolete line folding
                headers[-1] = (headers[-1][0], headers[-1][1] + " " + lines[i].strip())
            i += 1
        body = "\n".join(lines[i + 1:end]).strip()
        out.append(Recorded(f"response {n} (line {start + 1})", None, int(m.group(2)), m.group(1)[5:], headers, body))
    return out

"""The versioned result schema every measuring command writes (zgtool.result/1).

A result is a plain JSON object:
    {"schema": "zgtool.result/1", "kind": "<probe.tcp|latency_split|bench|...>",
     "command": "...", "created": ISO-8601, "target": {...} | null,
     "environment": {...}, "data": {...}}
`zgtool report html` and `zgtool gate` read only these files.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import json
import os
import platform
import socket
import sys
from pathlib import Path
from typing import Any

SCHEMA = "zgtool.result/1"


def environment() -> dict[str, Any]:
    """Host and versions; never imports torch (cheap, CLI-safe)."""
    from zgtool import __version__

    env: dict[str, Any] = {
        "host": socket.gethostname(),
        "platform": platform.platform(),
        "python": sys.version.split()[0],
        "zgtool": __version__,
        "cpus": os.cpu_count(),
    }
    if hasattr(os, "getloadavg"):      # the machine's load when the result was written (1, 5, 15 min)
        env["loadavg"] = [round(x, 2) for x in os.getloadavg()]
    torch_mod = sys.modules.get("torch")
    if torch_mod is not None:
        env["torch"] = getattr(torch_mod, "__version__", "?")
        try:
            env["device"] = "cuda" if torch_mod.cuda.is_available() else "cpu"
        except Exception:  # pragma: no cover - defensive
            env["device"] = "unknown"
    return env


def to_jsonable(obj: Any) -> Any:
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {k: to_jsonable(v) for k, v in dataclasses.asdict(obj).items()}
    if isinstance(obj, dict):
        return {str(k): to_jsonable(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [to_jsonable(v) for v in obj]
    if isinstance(obj, float) and obj != obj:  # NaN is not JSON
        return None
    if isinstance(obj, Path):
        return str(obj)
    return obj


# options whose values are secrets: a result records the command line with their values cut
_SECRET_OPTIONS = ("-H", "--header")


def _redacted_header(value: str) -> str:
    name, sep, _ = value.partition(":")
    return f"{name}: <redacted>" if sep else "<redacted>"


def command_line(argv: list[str]) -> str:
    """'zgtool ARGS' as a result records it: every -H/--header value shown as 'Name: <redacted>'."""
    out, secret_next = ["zgtool"], False
    for arg in argv:
        if secret_next:
            out.append(_redacted_header(arg))
            secret_next = False
        elif arg in _SECRET_OPTIONS:
            out.append(arg)
            secret_next = True
        elif arg.startswith("--header="):
            out.append("--header=" + _redacted_header(arg[len("--header="):]))
        elif arg.startswith("-H") and not arg.startswith("--"):
            out.append("-H" + _redacted_header(arg[2:]))
        else:
            out.append(arg)
    return " ".join(out)


def make_result(kind: str, data: Any, *, command: str = "", target: Any = None) -> dict[str, Any]:
    return {
        "schema": SCHEMA,
        "kind": kind,
        "command": command or command_line(sys.argv[1:]),
        "created": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        "target": to_jsonable(target),
        "environment": environment(),
        "data": to_jsonable(data),
    }


def write_result(result: dict[str, Any], path: str | Path) -> Path:
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(json.dumps(result, indent=2, sort_keys=False) + "\n")
    return p


def load_result(path: str | Path) -> dict[str, Any]:
    from zgtool.errors import UsageError

    p = Path(path)
    try:
        obj = json.loads(p.read_text())
    except FileNotFoundError as exc:
        raise UsageError(f"result file not found: {p}") from exc
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise UsageError(f"{p} is not a JSON result file: {exc}") from exc
    if not isinstance(obj, dict) or obj.get("schema") != SCHEMA:
        raise UsageError(f"{p} is not a zgtool result (expected schema {SCHEMA!r})")
    return obj

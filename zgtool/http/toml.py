"""One TOML loader: every problem (missing file, bad TOML, bad UTF-8) is a one-line error (the kit's
ConfigError unless the caller names its own)."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

from zgtool.http.errors import ConfigError


def parse_toml(text: str, where: str, error: type[Exception] = ConfigError) -> dict[str, Any]:
    """``tomllib.loads`` with the error mapped to ``error("<where>: invalid TOML: ...")``."""
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise error(f"{where}: invalid TOML: {exc}") from exc


def load_toml(path: Path | str, what: str = "file", error: type[Exception] = ConfigError) -> dict[str, Any]:
    """Read and parse ``path``; ``what`` names it in messages ("keys file", "safety policy")."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError as exc:
        raise error(f"{what} {p} does not exist") from exc
    except IsADirectoryError as exc:
        raise error(f"{what} {p} is a directory, not a file") from exc
    except UnicodeDecodeError as exc:
        raise error(f"{what} {p} is not UTF-8 text: {exc}") from exc
    except OSError as exc:
        raise error(f"cannot read {what} {p}: {exc.strerror}") from exc
    return parse_toml(text, f"{what} {p}", error)

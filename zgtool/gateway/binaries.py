"""Finding a gateway's binary: PATH, then the Debian locations (sbin is often not on a user's
PATH); a one-line MissingCapability (exit 4) naming the install command when it is not there.
ZGTOOL_SBIN_DIRS (colon-separated) replaces the Debian locations; empty: PATH only."""

from __future__ import annotations

import os
import shutil

from zgtool.errors import MissingCapability

_DIRS = "/usr/sbin:/usr/bin:/usr/local/sbin:/usr/local/bin"


def find_binary(name: str, install: str) -> str:
    dirs = [d for d in os.environ.get("ZGTOOL_SBIN_DIRS", _DIRS).split(":") if d]
    found = shutil.which(name) or next(
        (p for p in (os.path.join(d, name) for d in dirs) if os.access(p, os.X_OK)), None
    )
    if not found:
        raise MissingCapability(f"{name} not found on PATH or in {':'.join(dirs) or '(no sbin dirs)'}; "
                                f"install it with: {install}")
    return found

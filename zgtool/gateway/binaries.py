"""Finding a gateway's binary: PATH, then the Debian locations; a one-line MissingCapability
(exit 4) naming the install command when it is not there."""

from __future__ import annotations

import os
import shutil

from zgtool.errors import MissingCapability

_DIRS = ("/usr/sbin", "/usr/bin", "/usr/local/sbin", "/usr/local/bin")


def find_binary(name: str, install: str) -> str:
    found = shutil.which(name) or next(
        (p for p in (os.path.join(d, name) for d in _DIRS) if os.access(p, os.X_OK)), None
    )
    if not found:
        raise MissingCapability(f"{name} not found on PATH or in /usr/sbin; install it with: {install}")
    return found

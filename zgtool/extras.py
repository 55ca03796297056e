"""Which optional part of the install a command needs, checked before it imports any of it.

`pip install zgtool` is the client: every measuring command, no torch, and `serve --model null` (the
zero-compute backend needs none of the engine's modules). `zgtool[engine]` adds the fused engine's
dependencies (serve with a model, generate, verify). A command whose extra is missing raises
MissingCapability (exit 4) with one line naming the extra to install, never an ImportError.
"""

from __future__ import annotations

import importlib.util

from zgtool.errors import MissingCapability

# import name -> distribution name, for the line the user reads
ENGINE_MODULES: dict[str, str] = {
    "torch": "torch",
    "safetensors": "safetensors",
    "tokenizers": "tokenizers",
    "jinja2": "jinja2",
    "gguf": "gguf",
}
REDIS_MODULES: dict[str, str] = {"redis": "redis"}


def missing_modules(modules: dict[str, str]) -> list[str]:
    """Distribution names of the modules that cannot be imported here (not importing them)."""
    return [dist for name, dist in modules.items() if importlib.util.find_spec(name) is None]


def require_extra(command: str, extra: str = "engine", modules: dict[str, str] | None = None) -> None:
    """Raise MissingCapability naming `pip install 'zgtool[EXTRA]'` when a module is absent."""
    missing = missing_modules(ENGINE_MODULES if modules is None else modules)
    if missing:
        raise MissingCapability(
            f"`zgtool {command}` needs the {extra} extra: pip install 'zgtool[{extra}]' "
            f"(missing here: {', '.join(missing)})"
        )

"""Where the k6 scripts and payloads live: the repo's k6/ folder, or the installed package data."""

from __future__ import annotations

from pathlib import Path

from zgtool.errors import MissingCapability

GATEWAY_VS_DIRECT = "gateway_vs_direct.js"
RAMP = "ramp.js"
PAYLOADS = {"anthropic": "payloads/messages.json", "openai": "payloads/chat_completions.json"}
ENDPOINTS = {"anthropic": "/v1/messages", "openai": "/v1/chat/completions"}


def k6_dir() -> Path:
    """k6/ next to the zgtool package in a checkout (editable install), else zgtool/k6 when installed."""
    here = Path(__file__).resolve().parent.parent  # the zgtool package folder
    for candidate in (here.parent / "k6", here / "k6"):
        if (candidate / GATEWAY_VS_DIRECT).is_file():
            return candidate
    raise MissingCapability(f"the zgtool k6 scripts are missing (looked in {here.parent / 'k6'} and {here / 'k6'}); "
                            "reinstall zgtool")


def script(name: str) -> Path:
    return k6_dir() / name


def payload(api: str) -> Path:
    return k6_dir() / PAYLOADS[api]

"""Console entry point (`zgtool`, `python -m zgtool`): zgtool.app builds and runs the command tree.

Kept apart from zgtool.app so the entry point named in pyproject stays one line; the help's plain
metavars live in zgtool.plainhelp."""

from __future__ import annotations


def main() -> None:
    from zgtool.app import main as app_main

    app_main()

"""Does a renderable fit the terminal: printed at a width, every cell whole (no ellipsis, no line past
the edge). Shared by every latency renderer, which pick a table or a list form with it."""

from __future__ import annotations

from rich.console import Console


def printed_text(renderable: object, width: int) -> str:
    console = Console(width=width, record=True, force_terminal=False, color_system=None)
    with console.capture() as cap:
        console.print(renderable)
    return cap.get()


def fits(renderable: object, width: int) -> bool:
    """Printed at `width`, every cell shows whole: no ellipsis, no line past the edge."""
    text = printed_text(renderable, width)
    return "…" not in text and max((len(ln) for ln in text.splitlines()), default=0) <= width


def natural_width(renderable: object) -> int:
    return max((len(ln.rstrip()) for ln in printed_text(renderable, 1000).splitlines()), default=0)

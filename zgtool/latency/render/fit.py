"""Does a renderable fit the terminal: printed at a width, every cell whole (no ellipsis, no line past
the edge, no word folded or cropped). Shared by every renderer that picks a table or a list form with it."""

from __future__ import annotations

from collections import Counter

from rich.console import Console

WIDE = 1000      # the width at which nothing wraps: a renderable's words as they are


def printed_text(renderable: object, width: int) -> str:
    console = Console(width=width, record=True, force_terminal=False, color_system=None)
    with console.capture() as cap:
        console.print(renderable)
    return cap.get()


def _rule(word: str) -> bool:
    """A run of box-drawing or block characters: a separator or a bar, whose length follows the table's."""
    return all("\u2500" <= ch <= "\u259f" for ch in word)


def words(text: str) -> Counter[str]:
    return Counter(w for w in text.split() if not _rule(w))


def fits(renderable: object, width: int) -> bool:
    """Printed at `width`, every cell shows whole: no ellipsis, no line past the edge, and the same words
    as printed at full width, so a cell may wrap between words but none is folded mid-word or cropped
    (a label column squeezed to one letter a line kept every line inside the edge)."""
    text = printed_text(renderable, width)
    if "…" in text or max((len(ln) for ln in text.splitlines()), default=0) > width:
        return False
    return words(text) == words(printed_text(renderable, WIDE))


def natural_width(renderable: object) -> int:
    return max((len(ln.rstrip()) for ln in printed_text(renderable, WIDE).splitlines()), default=0)

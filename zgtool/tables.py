"""A table that never cuts a cell: the columns side by side where they fit the terminal, else one record
per row as `key: value` lines (a value wraps whole, a URL or a number is never shortened to `…`)."""

from __future__ import annotations

from collections.abc import Sequence

from rich.console import Group
from rich.table import Table
from rich.text import Text

from zgtool.latency.render.fit import fits


def whole_table(title: str, columns: Sequence[str], rows: Sequence[Sequence[str]], width: int) -> Table | Group:
    """The table when every cell fits whole at `width`; otherwise the same rows as records."""
    table = Table(title=title, title_justify="left")
    for col in columns:
        table.add_column(col, no_wrap=True)
    for row in rows:
        table.add_row(*row)
    if fits(table, width):
        return table
    key_w = max(len(c) for c in columns[1:]) if len(columns) > 1 else 0
    parts: list[Text] = [Text(title, style="bold")]
    for row in rows:
        parts.append(Text(row[0], style="bold"))
        for col, value in zip(columns[1:], row[1:], strict=True):
            parts.append(Text(f"  {col:<{key_w}}  {value}"))
    return Group(*parts)

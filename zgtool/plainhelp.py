"""The help's plain metavars (zgtool.app applies plain_help to the built command tree).

Typer 0.2x renders every parameter's Python type (`<bool>`, `<list[str]>`) and wraps
required arguments in braces (`{targets}...`). `plain_help` rewrites the built click
tree once so help reads like click's: `TARGETS...`, `--port INT`, nothing after flags.
"""

from __future__ import annotations

from typing import Any

# Python type names typer prints -> click-style metavars.
_PLAIN_TYPES = {"int": "INT", "str": "TEXT", "float": "FLOAT", "path": "PATH", "file": "FILE",
                "directory": "DIR", "bool": "BOOLEAN", "datetime": "DATETIME"}


def plain_metavar(typer_label: str | None) -> str | None:
    """`<int>` -> `INT`, `<list[str]>` -> `TEXT`, `<a|b>` -> `a|b` (choices stay as typed)."""
    if not typer_label:
        return None
    label = typer_label.strip()
    suffix = ""
    if label.endswith("..."):
        label, suffix = label[:-3], "..."
    if label.startswith("<") and label.endswith(">"):
        label = label[1:-1]
    while label.startswith("list[") and label.endswith("]"):
        label = label[5:-1]
    if "|" in label:
        return label + suffix
    if label.endswith(" range"):
        label = label[: -len(" range")]
    return _PLAIN_TYPES.get(label, label.upper()) + suffix


def _plain_argument_class(base: Any) -> type:
    class PlainArgument(base):  # type: ignore[misc, valid-type]
        @property
        def display_name_raw(self) -> str:
            return str(self.metavar) if self.metavar is not None else str(self.name).upper()

        def _rich_display_name(self) -> str:
            name = self.display_name_raw
            return name + "..." if self.metavar is None and self.nargs != 1 else name

        def _usage_display_name(self) -> str:
            name = self._rich_display_name()
            return name if self.required else f"[{name}]"

        def display_type_rich(self, ctx: Any) -> str | None:
            label = plain_metavar(base.display_type(self, ctx))
            return label if label and "|" in label else None     # choices help; TEXT after a name does not

    return PlainArgument


def _plain_option_class(base: Any) -> type:
    class PlainOption(base):  # type: ignore[misc, valid-type]
        def display_type_rich(self, ctx: Any) -> str | None:
            if self.is_flag or self.count:
                return None
            if self.metavar is not None:
                return str(self.metavar)
            label = plain_metavar(base.display_type(self, ctx))
            if label is not None and self.nargs != 1 and not label.endswith("..."):
                label += "..."
            return label

    return PlainOption


_CLASSES: dict[type, type] = {}


def _plain_class(param: Any) -> type | None:
    cls = type(param)
    if cls in _CLASSES.values():
        return None
    if cls not in _CLASSES:
        kind = getattr(param, "param_type_name", "")
        if kind == "argument":
            _CLASSES[cls] = _plain_argument_class(cls)
        elif kind == "option":
            _CLASSES[cls] = _plain_option_class(cls)
        else:
            return None
    return _CLASSES[cls]


def _make_plain(param: Any) -> Any:
    if param is not None and hasattr(param, "display_type"):   # plain click parameters render plainly already
        new_cls = _plain_class(param)
        if new_cls is not None:
            param.__class__ = new_cls
    return param


def fold_long_words() -> None:
    """Help never cuts a word: Rich crops a token longer than its column (a URL, the --dataset grammar, a
    long option name) to `…`; typer's help tables fold it onto the next line instead."""
    import typer.rich_utils as rich_utils
    from rich.table import Table

    if getattr(rich_utils.Table, "folds", False):
        return

    class FoldingTable(Table):
        folds = True

        def add_row(self, *renderables: Any, **kw: Any) -> None:
            super().add_row(*renderables, **kw)
            for column in self.columns:
                column.overflow = "fold"

    rich_utils.Table = FoldingTable  # type: ignore[misc]
    parameter_help = rich_utils._get_parameter_help

    def folded_parameter_help(*args: Any, **kw: Any) -> Any:
        columns = parameter_help(*args, **kw)
        for item in getattr(columns, "renderables", ()):
            if hasattr(item, "overflow"):
                item.overflow = "fold"
        return columns

    rich_utils._get_parameter_help = folded_parameter_help


def _group_options(command: Any) -> None:
    """Long option lists in the vocabulary's panels (zgtool.commands.vocabulary.PANELS)."""
    from zgtool.commands.vocabulary import PANEL_MIN_OPTIONS, PANELS

    options = [p for p in getattr(command, "params", []) if getattr(p, "opts", None) and
               not getattr(p, "hidden", False) and p.param_type_name == "option"]
    if len(options) < PANEL_MIN_OPTIONS:
        return
    for param in options:
        if getattr(param, "rich_help_panel", None):
            continue
        panel = next((PANELS[o] for o in param.opts if o in PANELS), None)
        if panel is not None:
            param.rich_help_panel = panel


def _folding_on_first_help(command: Any) -> None:
    """fold_long_words() when this command first renders its help, not at every start: it imports typer's
    Rich help renderer (rich.markdown, markdown_it: ~70 ms of a start here), which a command that prints no help never needs."""
    original = command.format_help

    def format_help(ctx: Any, formatter: Any) -> Any:
        fold_long_words()
        return original(ctx, formatter)

    command.format_help = format_help


def plain_help(command: Any) -> Any:
    """Give every parameter in a click command tree click-style help rendering; returns it."""
    _folding_on_first_help(command)
    _group_options(command)
    for param in getattr(command, "params", []):
        _make_plain(param)
    original = command.get_help_option

    def get_help_option(ctx: Any) -> Any:      # --help is built lazily, on first use
        return _make_plain(original(ctx))

    command.get_help_option = get_help_option
    for sub in getattr(command, "commands", {}).values():
        plain_help(sub)
    return command

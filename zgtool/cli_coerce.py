"""Typer's per-option value coercion, without pydantic where the answer is plain.

Typer 0.29 turns every option's value (its default included) into its type through a pydantic
TypeAdapter built for that option, so every `zgtool` command imported pydantic and built an adapter
per option before doing anything: about 0.1 s of each invocation's 0.45 s here. Our options are
str, bool, int, float, Path and lists of str or Path, with no parser and at most a lower bound
(tests/cli/test_cli_coerce.py lists them). `install` gives each such option a `Quick` coercion that
answers the plain cases itself (a str, an int or float already of its type or written as plain
digits, a Path checked by typer's own path rules) and hands anything else to the adapter typer
would have built, built then: an odd value gets typer's own result and its own error text.
Tested differentially against typer's adapters (tests/cli/test_cli_coerce.py)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, get_args, get_origin

from typer._click import Context
from typer._click.core import Command
from typer._coercion import RuntimeParam, TypeDescriptor, build_runtime_param
from typer._param_types import coerce_cli_path
from typer.core import _TyperParameter

_INT = re.compile(r"-?[0-9]{1,18}")
_FLOAT = re.compile(r"-?[0-9]{1,15}(?:\.[0-9]{1,15})?")
_SLOW = object()                     # "not a plain case": the adapter decides
_LEAVES = (str, bool, int, float, Path)


def _plain(descriptor: TypeDescriptor) -> bool:
    """An option whose values this module may answer: a leaf type (or a list of str or Path) with no
    parser, no upper bound or clamp, and no path constraint typer's path rules would not check."""
    info = descriptor.parameter_info
    annotation: Any = descriptor.annotation
    if get_origin(annotation) is list:
        args = get_args(annotation)
        if len(args) != 1 or args[0] not in (str, Path):
            return False
        annotation = args[0]
    if annotation not in _LEAVES or descriptor.file_annotation is not None:
        return False
    if info.parser is not None or info.max is not None or info.clamp:
        return False
    return annotation in (int, float) or info.min is None


@dataclass(frozen=True)
class Quick(RuntimeParam):
    """A typer RuntimeParam (its `coerce` handles None and multi-value options as typer's does) that
    answers plain values itself and builds typer's own coercion for anything else."""

    descriptor: TypeDescriptor = field(compare=False)
    _slow: list[RuntimeParam] = field(default_factory=list, compare=False, repr=False)

    def slow(self) -> RuntimeParam:
        if not self._slow:
            self._slow.append(build_runtime_param(self.descriptor))
        return self._slow[0]

    def _coerce_value(self, value: Any, param: _TyperParameter, ctx: Context) -> Any:
        annotation: Any = self.annotation
        if get_origin(annotation) is list:
            if not isinstance(value, (list, tuple)):
                return self.slow()._coerce_value(value, param=param, ctx=ctx)
            leaf = get_args(annotation)[0]
            out = [self._leaf(leaf, v, param, ctx) for v in value]
            if any(v is _SLOW for v in out):
                return self.slow()._coerce_value(value, param=param, ctx=ctx)
            return out
        out = self._leaf(annotation, value, param, ctx)
        return self.slow()._coerce_value(value, param=param, ctx=ctx) if out is _SLOW else out

    def _leaf(self, leaf: type, value: Any, param: _TyperParameter, ctx: Context) -> Any:
        if leaf is str:
            return value if type(value) is str else _SLOW
        if leaf is int or leaf is float:
            pattern = _INT if leaf is int else _FLOAT
            if type(value) is leaf:
                number: Any = value
            elif type(value) is str and pattern.fullmatch(value):
                number = leaf(value)
            else:
                return _SLOW
            return number if self._in_range(number) else _SLOW
        if leaf is Path:
            if isinstance(value, Path):
                path = value
            elif type(value) is str and value and value.strip() == value and "\0" not in value:
                path = Path(value)
            else:
                return _SLOW
            return coerce_cli_path(path, self.parameter_info, path_type=Path, param=param, ctx=ctx)
        return value if type(value) is bool else _SLOW

    def _in_range(self, number: float) -> bool:
        low = self.parameter_info.min
        return low is None or number >= low


def quicken(param: Any) -> Any:
    """Give `param` a Quick coercion when its values are plain (else it keeps typer's); returns it."""
    if isinstance(param, _TyperParameter) and param._runtime_param is None and _plain(param.type_descriptor):
        td = param.type_descriptor
        param._runtime_param = Quick(parameter_info=td.parameter_info, annotation=td.annotation, descriptor=td)
    return param


def install(command: Command) -> Command:
    """Quicken every option of `command` and its subcommands, --help included (click builds that one
    lazily, so its getter is wrapped as zgtool.plainhelp wraps it); returns `command`."""
    for param in command.params:
        quicken(param)
    original = command.get_help_option

    def get_help_option(ctx: Context) -> Any:
        return quicken(original(ctx))

    command.get_help_option = get_help_option      # type: ignore[method-assign]
    for sub in getattr(command, "commands", {}).values():
        install(sub)
    return command

"""zgtool.cli_coerce answers plain option values without pydantic, and every value gets what typer's own
coercion (its pydantic adapters, the reference) gives: the same value of the same type, or the same error."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import typer
from typer._click import Context
from typer._click.exceptions import BadParameter
from typer._coercion import build_runtime_param

from zgtool.cli_coerce import Quick, _plain, install, quicken

ROOT = Path(__file__).resolve().parents[2]


def _probe_command() -> Any:
    """A typer command with one option of each kind zgtool's commands declare."""
    app = typer.Typer()

    @app.command()
    def cmd(s: str = typer.Option("d"), b: bool = typer.Option(False), i: int = typer.Option(3),
            f: float = typer.Option(1.5), p: Path = typer.Option(Path("x")),
            ls: list[str] = typer.Option([]), lp: list[Path] = typer.Option([]),
            imin: int = typer.Option(1, min=1), fmin: float = typer.Option(0.5, min=0.0),
            s_none: str | None = typer.Option(None), p_none: Path | None = typer.Option(None)) -> None:
        """Probe."""

    return typer.main.get_command(app)


@pytest.fixture(scope="module")
def params(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    command = _probe_command()
    return {p.name: p for p in command.params} | {"_ctx": Context(command)}


def _outcome(runtime: Any, value: Any, param: Any, ctx: Context) -> tuple[str, Any, type | None]:
    try:
        out = runtime.coerce(value, param=param, ctx=ctx)
    except BadParameter as exc:
        return ("error", exc.message, None)
    return ("value", repr(out), type(out))      # repr: nan equals nan


def _same_as_typer(name: str, value: Any, params: dict[str, Any]) -> None:
    param, ctx = params[name], params["_ctx"]
    td = param.type_descriptor
    assert _plain(td), name
    quick = Quick(parameter_info=td.parameter_info, annotation=td.annotation, descriptor=td)
    reference = build_runtime_param(td)
    assert _outcome(quick, value, param, ctx) == _outcome(reference, value, param, ctx), (name, value)


ODD_NUMBERS = ["", " 5", "5 ", "+5", "1_000", "1.0", "1.", ".5", "1e3", "-0", "007", "abc", "inf", "nan", "0x10",
               "99999999999999999999999", "-3", "0", "12", "-2.25", "007.50", "3.14159", "٣"]


@pytest.mark.parametrize("value", [*ODD_NUMBERS, 5, 0, -7, 5.0, 2.5, True, None])
@pytest.mark.parametrize("name", ["i", "f", "imin", "fmin"])
def test_numbers_coerce_as_typers_adapters_do_errors_included(name: str, value: Any, params: dict[str, Any]) -> None:
    _same_as_typer(name, value, params)


@pytest.mark.parametrize("value", ["", "x", " x ", "ünï", "-", "a b", "--flag", 5, None, b"raw"])
@pytest.mark.parametrize("name", ["s", "s_none"])
def test_strings_coerce_as_typers_adapters_do(name: str, value: Any, params: dict[str, Any]) -> None:
    _same_as_typer(name, value, params)


def test_paths_coerce_as_typers_adapters_do(params: dict[str, Any], tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    for value in ["x", "", " x", "x ", ".", "~", "/", str(tmp_path), str(tmp_path / "file"), str(tmp_path / "no"),
                  "a/../b", Path("y"), tmp_path, 5, None]:
        for name in ("p", "p_none"):
            _same_as_typer(name, value, params)


@pytest.mark.parametrize("value", [(), ("a",), ("a", "b"), ["x", "y"], ("1", 2), "a", None])
def test_lists_coerce_as_typers_adapters_do(value: Any, params: dict[str, Any]) -> None:
    _same_as_typer("ls", value, params)
    _same_as_typer("lp", value, params)


@pytest.mark.parametrize("value", [True, False, "true", "0", "", None])
def test_flags_coerce_as_typers_adapters_do(value: Any, params: dict[str, Any]) -> None:
    _same_as_typer("b", value, params)


@pytest.mark.parametrize(("name", "value"), [("s", "x"), ("i", "12"), ("i", 4), ("f", "2.5"), ("f", 0.5), ("p", "x"),
                                           ("ls", ("a", "b")), ("lp", ["x"]), ("imin", "3"), ("fmin", "0")])
def test_plain_values_are_answered_without_building_typers_adapter(name: str, value: Any,
                                                                   params: dict[str, Any]) -> None:
    td = params[name].type_descriptor
    quick = Quick(parameter_info=td.parameter_info, annotation=td.annotation, descriptor=td)
    quick.coerce(value, param=params[name], ctx=params["_ctx"])
    assert quick._slow == []


def test_an_option_with_a_parser_or_an_upper_bound_keeps_typers_coercion() -> None:
    app = typer.Typer()

    @app.command()
    def cmd(up: int = typer.Option(1, max=9), parsed: int = typer.Option(1, parser=int)) -> None:
        """Probe."""

    command = install(typer.main.get_command(app))
    assert all(p._runtime_param is None for p in command.params if p.name in ("up", "parsed"))


def test_every_zgtool_option_is_answered_without_pydantic() -> None:
    """Every option of every command is plain (a new one with a parser or an upper bound would import
    pydantic on each invocation of its command: give it a callback check instead, or widen cli_coerce)."""
    from zgtool.app import _register_all, app
    from zgtool.plainhelp import plain_help

    _register_all()
    command = install(plain_help(typer.main.get_command(app)))
    slow: list[str] = []

    def walk(cmd: Any, path: str) -> None:
        for p in cmd.params:
            runtime = quicken(p)._runtime_param
            if not isinstance(runtime, Quick):
                slow.append(f"{path} {p.name}")
                continue
            if p.default is not None and not callable(p.default):   # every default is coerced on each run
                runtime.coerce(p.default, param=p, ctx=Context(cmd))
                if runtime._slow:
                    slow.append(f"{path} {p.name} default {p.default!r}")
        for name, sub in getattr(cmd, "commands", {}).items():
            walk(sub, f"{path} {name}")

    walk(command, "zgtool")
    assert slow == []


@pytest.mark.parametrize("argv", [["gate", "tests/gate/data/vllm_haproxy_aa_run2.json"],
                                  ["latency-split", "--help"], ["gate", "--no-such-flag"]])
def test_a_command_runs_without_importing_pydantic(argv: list[str]) -> None:
    code = ("import sys\nfrom zgtool.app import _register_all, _run\n_register_all()\n"
            f"rc = _run({argv!r})\nprint('pydantic' in sys.modules, rc, file=sys.stderr)")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.stderr.strip().splitlines()[-1].startswith("False "), out.stderr


def test_a_bad_number_still_gets_typers_own_message() -> None:
    out = subprocess.run([sys.executable, "-m", "zgtool", "latency-split", "http://127.0.0.1:9", "-n", "abc"],
                         cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 2
    assert "Invalid value for '-n' / '--requests': Input should be a valid integer" in out.stderr

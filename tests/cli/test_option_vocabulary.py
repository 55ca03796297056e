"""One option vocabulary across the measuring commands (-n requests, -c concurrency, -o output,
--timeout-s, -k, -q), the old spellings still accepted but hidden, and every measuring command's --help
ending with real examples that parse."""

from __future__ import annotations

import shlex
from typing import Any

import pytest
import typer
from zgtest import run_zgtool

from zgtool.app import _register_all, app

MEASURING = ["latency-split", "bench", "verify", "client ask", "probe", "dcgm watch", "defrag", "report html"]
# the shared options, where the command has the setting at all
SHORT = {"--requests": "-n", "--concurrency": "-c", "--output": "-o", "--record": "-o",
         "--insecure": "-k", "--quiet": "-q"}
HIDDEN_OLD = {"latency-split": ["--timeout"], "probe": ["--timeout"], "defrag": ["--timeout"],
              "bench": ["--no-progress"], "verify": ["--out"]}   # verify's folder is --out-dir now


def _root() -> Any:
    if not app.registered_commands:
        _register_all()
    return typer.main.get_command(app)


def _command(path: str) -> Any:
    cmd = _root()
    for part in path.split():
        cmd = cmd.commands[part]
    return cmd


def _options(path: str) -> dict[str, Any]:
    return {name: p for p in _command(path).params for name in getattr(p, "opts", [])}


@pytest.mark.parametrize("path", MEASURING)
def test_shared_options_have_the_shared_spelling(path: str) -> None:
    opts = _options(path)
    for long, short in SHORT.items():
        if long in opts:
            assert short in opts[long].opts, f"{path}: {long} should also be {short}"
    assert "--timeout" not in opts or opts["--timeout"].hidden, f"{path}: a visible --timeout; use --timeout-s"
    for old in HIDDEN_OLD.get(path, []):
        assert old in opts and opts[old].hidden, f"{path}: the old {old} must still parse, hidden"
    if any(n.startswith("--timeout") for n in opts):
        assert "--timeout-s" in opts, path


def test_requests_concurrency_and_output_are_spelled_alike_where_they_exist() -> None:
    assert {"-n", "-c", "-o", "-q", "--timeout-s", "--csv"} <= set(_options("latency-split"))
    assert {"-n", "-c", "-o", "-q", "--csv", "--timeout-s"} <= set(_options("verify"))
    assert {"-o", "-q", "--csv", "--otlp-endpoint", "--timeout-s"} <= set(_options("bench"))
    assert {"-o", "--timeout-s", "-k"} <= set(_options("client ask"))
    assert {"-o", "--timeout-s", "-k"} <= set(_options("probe"))
    assert {"--timeout-s", "-o", "-k"} <= set(_options("defrag"))


def _examples(help_text: str) -> list[str]:
    lines = help_text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip() == "Examples:")
    out = []
    for line in lines[start + 1:]:
        text = line.strip().strip("│").strip()
        if not text.startswith("zgtool "):
            break
        out.append(text.split("   (")[0])      # "(and 2/2 at once)" style remarks are not arguments
    return out


def _parse(argv: list[str]) -> None:
    """Parse (not run) argv against the real click tree, as `zgtool` does (URLs first included): unknown options or
    bad values raise."""
    from zgtool.app import url_shorthand

    argv = url_shorthand(argv)
    cmd, parent = _root(), None
    name = "zgtool"
    while True:
        ctx = cmd.make_context(name, list(argv), parent=parent)
        sub = getattr(cmd, "commands", None)
        rest = [*getattr(ctx, "_protected_args", []), *ctx.args]
        if not sub or not rest or rest[0] not in sub:
            return
        name, cmd, argv, parent = rest[0], sub[rest[0]], rest[1:], ctx


@pytest.mark.parametrize("path", MEASURING)
def test_help_ends_with_examples_that_parse(path: str) -> None:
    r = run_zgtool(*path.split(), "--help")
    assert r.returncode == 0, r.stderr
    examples = _examples(r.stdout)
    assert 2 <= len(examples) <= 4, r.stdout
    for ex in examples:
        argv = shlex.split(ex)[1:]
        _parse(argv)


def test_verify_takes_its_folder_as_out_dir_and_o_as_the_result_file() -> None:
    opts = _options("verify")
    assert "--out-dir" in opts and opts["-o"].opts == ["-o", "--output"]
    assert opts["--out"].hidden      # the old spelling still parses, with a deprecation line

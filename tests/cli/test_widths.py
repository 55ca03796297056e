"""No number, URL or label is ever cut to `…`: every table-producing command rendered at 60, 80 and 120
columns (a pipe, NO_COLOR) against a real null engine, and every command's --help. The answer comes
first: latency-split's first stdout line is its verdict sentence."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from rich.console import Console
from zgtest import run_zgtool, stop_process, wait_port

from zgtool.http.net import free_port

WIDTHS = (60, 80, 120)
DATA = Path(__file__).resolve().parents[1] / "report" / "data"


def command_paths() -> list[list[str]]:
    import typer

    from zgtool.app import _register_all, app

    _register_all()
    root = typer.main.get_command(app)
    out: list[list[str]] = []

    def walk(cmd: object, path: list[str]) -> None:
        out.append(path)
        for name, sub in getattr(cmd, "commands", {}).items():
            walk(sub, [*path, name])

    walk(root, [])
    return out


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    port = free_port()
    log = (tmp_path_factory.mktemp("widths") / "serve.log").open("wb")
    proc = subprocess.Popen([sys.executable, "-m", "zgtool", "serve", "--model", "null", "--host", "127.0.0.1",
                             "--port", str(port)], stdout=log, stderr=subprocess.STDOUT,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        wait_port(port, timeout_s=60)
        yield f"http://127.0.0.1:{port}"
    finally:
        stop_process(proc)
        log.close()


def assert_whole(text: str, what: str) -> None:
    assert "…" not in text, f"{what}: a cut cell\n{text}"


# Every command's --help rendered in ONE child interpreter per width, through the CLI's own _run (the
# parse-and-invoke every `zgtool` call goes through): a fresh interpreter per help costs ~0.45 s, x25 commands
# x3 widths. test_the_in_process_helps_are_what_a_user_sees holds them to a real `zgtool ... --help`.
_HELPS = """
import contextlib, io, json, sys
from zgtool.app import _register_all, _run
_register_all()
out = {}
for path in json.loads(sys.argv[1]):
    buf, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(err):
        code = _run([*path, "--help"])
    out[" ".join(path)] = [code, buf.getvalue(), err.getvalue()]
print(json.dumps(out))
"""


def helps_at(width: int, paths: list[list[str]]) -> dict[str, list]:
    """' '.join(path) -> [exit code, stdout, stderr] of `zgtool PATH --help` at `width` columns (a pipe, NO_COLOR)."""
    env = {**os.environ, "COLUMNS": str(width), "NO_COLOR": "1"}
    env.pop("ZGTOOL_DEBUG", None)
    r = subprocess.run([sys.executable, "-c", _HELPS, json.dumps(paths)], capture_output=True, text=True,
                       timeout=300, env=env)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)  # type: ignore[no-any-return]


@pytest.mark.parametrize("width", WIDTHS)
def test_every_help_is_whole_at_any_width(width: int) -> None:
    paths = command_paths()
    helps = helps_at(width, paths)
    assert sorted(helps) == sorted(" ".join(p) for p in paths)
    for name, (code, out, err) in helps.items():
        assert code == 0, (name, err)
        assert_whole(out, f"zgtool {name} --help at {width}")
        assert "\\b" not in out, name
        assert "Examples:" in out, f"zgtool {name} --help has no examples"


@pytest.mark.parametrize("path", [[], ["latency-split"], ["gateway"]])
def test_the_in_process_helps_are_what_a_user_sees(path: list[str]) -> None:
    helps = helps_at(60, [path])
    r = run_zgtool(*path, "--help", columns=60)
    assert [r.returncode, r.stdout, r.stderr] == helps[" ".join(path)]


def test_generates_old_n_still_works_with_a_deprecation_line() -> None:
    r = run_zgtool("generate", "--model", "null", "-n", "3", "--json", timeout_s=120)
    assert r.returncode == 0, r.stderr
    assert "-n is deprecated here, use --max-tokens" in r.stderr
    assert json.loads(r.stdout.splitlines()[-1])["kind"] == "generate"


@pytest.mark.parametrize("width", WIDTHS)
def test_latency_split_states_its_verdict_first_and_cuts_nothing(engine: str, width: int, tmp_path: Path) -> None:
    out = tmp_path / "pair.json"
    r = run_zgtool("latency-split", engine, engine, "-n", "12", "-o", out, columns=width, timeout_s=120)
    assert r.returncode == 0, r.stderr
    first = r.stdout.splitlines()[0]
    assert " per request " in first and ("significant" in first or "n.s." in first), first
    assert_whole(r.stdout, f"latency-split A B at {width}")
    assert " * " in r.stdout + " " or " n.s." in r.stdout          # significance as text, not only a style
    g = run_zgtool("gate", out, columns=width)
    assert g.returncode == 0, g.stdout + g.stderr
    assert_whole(g.stdout, f"gate at {width}")
    one = run_zgtool("latency-split", engine, "-n", "8", "--no-stream", "--brief", columns=width, timeout_s=120)
    assert one.returncode == 0, one.stderr
    assert one.stdout.splitlines()[0].startswith(f"{engine}: median total ")


@pytest.mark.parametrize("width", WIDTHS)
def test_targets_list_every_url_whole(width: int, tmp_path: Path) -> None:
    cfg = tmp_path / "zgtool.toml"
    cfg.write_text('[targets.gw]\nurl = "https://gateway-with-a-long-name.internal.example:18443/v1"\n'
                   'api = "openai"\nmodel = "meta-llama/Llama-3.1-8B-Instruct"\n')
    r = run_zgtool("targets", "--config", cfg, columns=width)
    assert r.returncode == 0, r.stderr
    assert_whole(r.stdout, f"targets at {width}")
    assert "https://gateway-with-a-long-name.internal.example:18443/v1" in r.stdout.replace("\n", "")


@pytest.mark.parametrize("width", WIDTHS)
def test_verifys_tax_table_keeps_every_configuration_label_and_figure(width: int) -> None:
    from zgtool.verify.summary import _tax_table

    verdict = json.loads((DATA / "verify" / "verify.json").read_text())["data"]["verdict"]
    console = Console(width=width, record=True, force_terminal=False, color_system=None)
    with console.capture() as cap:
        _tax_table(verdict, console)
    text = cap.get()
    assert_whole(text, f"verify tax table at {width}")
    for row in verdict["rows"]:
        assert row["label"] in text
    assert "n.s." in text and "*" in text


def test_long_option_lists_are_grouped_in_the_vocabularys_panels() -> None:
    r = run_zgtool("latency-split", "--help", columns=120)
    panels = [ln.split("─")[1].strip() for ln in r.stdout.splitlines() if ln.startswith("╭─ ")]
    assert {"Load", "Workload", "Attribution", "Output"} <= set(panels), panels
    load = r.stdout.split("╭─ Load")[1].split("╰")[0]
    assert "--requests" in load and "-n" in load
    output = r.stdout.split("╭─ Output")[1].split("╰")[0]
    assert "--output" in output and "-o" in output

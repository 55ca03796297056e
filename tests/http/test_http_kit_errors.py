"""The HTTP kit raises its own errors (zgtool/http/errors.py: KitError > ConfigError), never the
CLI's, and each caller maps them once: the CLI (zgtool/errors.py, zgtool/app.py) to exit 2 with
one line, pygw's entry point the same, the engine's server (engine/server/errors.py) to a status."""

from __future__ import annotations

from pathlib import Path

import pytest
from zgtest import run_zgtool

from zgtool.engine.server.errors import to_http_error
from zgtool.errors import ExitCode, UsageError, ZgError, exit_code_for
from zgtool.http.errors import ConfigError, KitError
from zgtool.http.keys import load_keys, parse_keys
from zgtool.http.toml import load_toml

BAD_KEYS = "[[keys]]\nname = 'a'\ntier = 'nope'\nkey = 'k'\n"


def test_the_kits_errors_are_its_own_not_the_clis(tmp_path: Path) -> None:
    p = tmp_path / "k.toml"
    p.write_text(BAD_KEYS)
    for call in (lambda: load_keys(p), lambda: load_toml(tmp_path / "absent.toml", "keys file"),
                 lambda: parse_keys({"keys": "x"}, "k.toml")):
        with pytest.raises(ConfigError) as err:
            call()
        assert isinstance(err.value, KitError) and not isinstance(err.value, (UsageError, ZgError))
        assert "\n" not in str(err.value)


def test_the_cli_maps_a_kit_error_to_exit_2_and_the_server_to_its_status() -> None:
    err = ConfigError("keys file k.toml: keys must be [[keys]] entries")
    assert exit_code_for(err) is ExitCode.USAGE
    http = to_http_error(err)
    assert http.status == 500 and http.error_type == "api_error" and http.message == str(err)


@pytest.mark.parametrize(("text", "words"), [
    (BAD_KEYS, "tier 'nope', which is not defined"),
    ("not toml = = =", "invalid TOML"),
])
def test_serve_with_a_bad_keys_file_exits_2_with_one_line(tmp_path: Path, text: str, words: str) -> None:
    keys = tmp_path / "keys.toml"
    keys.write_text(text)
    proc = run_zgtool("serve", "--model", "null", "--port", "0", "--keys", keys, timeout_s=60)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and words in lines[0] and str(keys) in lines[0], proc.stderr
    assert "Traceback" not in proc.stderr and "bug:" not in proc.stderr


def test_serve_with_a_missing_keys_file_exits_2_with_one_line(tmp_path: Path) -> None:
    proc = run_zgtool("serve", "--model", "null", "--port", "0", "--keys", tmp_path / "absent.toml", timeout_s=60)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "does not exist" in lines[0], proc.stderr


def test_pygw_with_a_bad_keys_file_exits_2_with_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from zgtool.gateway.pygw_main import main

    keys = tmp_path / "keys.toml"
    keys.write_text(BAD_KEYS)
    with pytest.raises(SystemExit) as ex:
        main(["--upstream", "http://127.0.0.1:9", "--port", "9", "--keys", str(keys)])
    assert ex.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("pygw: ") and "not defined" in err[0]

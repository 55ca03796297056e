"""`zgtool report html` on the command line: output file, defaults and one-line errors with exit 2."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from zgtest import run_zgtool

ZG = [sys.executable, "-m", "zgtool"]


def zg(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return run_zgtool(*args, cwd=cwd)


def test_report_html_writes_the_named_file(data_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "r" / "out.html"
    proc = zg("report", "html", str(data_dir / "verify"), str(data_dir / "single" / "probe.tls.json"), "-o", str(out))
    assert proc.returncode == 0, proc.stderr
    text = out.read_text()
    assert text.startswith("<!DOCTYPE html>") and "probe.tls" in text


def test_without_output_the_report_goes_into_the_first_folder(data_dir: Path, tmp_path: Path) -> None:
    folder = tmp_path / "run"
    shutil.copytree(data_dir / "single", folder)
    proc = zg("report", "html", str(folder))
    assert proc.returncode == 0, proc.stderr
    assert (folder / "report.html").is_file()


def test_a_missing_path_exits_2_with_one_line(tmp_path: Path) -> None:
    proc = zg("report", "html", str(tmp_path / "nope"), "-o", str(tmp_path / "x.html"))
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0 and "no such file or folder" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_a_non_result_file_exits_2_naming_it(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text('{"schema": "other/1"}')
    proc = zg("report", "html", str(bad), "-o", str(tmp_path / "x.html"))
    assert proc.returncode == 2 and "is not a zgtool result" in proc.stderr and str(bad) in proc.stderr


def test_output_to_a_folder_exits_2(data_dir: Path, tmp_path: Path) -> None:
    proc = zg("report", "html", str(data_dir / "single"), "-o", str(tmp_path))
    assert proc.returncode == 2 and "is a folder" in proc.stderr

"""`zgtool verify --csv DIR`: every stage's result as CSV files beside the report folder's JSON."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
from verify_run import csv_dir as verify_csv_dir
from zgtest import run_zgtool

from zgtool.errors import ExitCode


def _rows(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


@pytest.mark.slow
def test_every_stage_result_becomes_csv_files_named_after_it(quick_run) -> None:  # noqa: ANN001
    proc, out, _ = quick_run       # test_verify_cli.py's one `verify --quick ... --csv DIR` run
    csv_dir = verify_csv_dir(out)
    assert proc.returncode == 0, proc.stderr[-2000:]
    splits = sorted(out.glob("latency_split-*.json"))
    assert splits
    for f in splits:
        data = json.loads(f.read_text())["data"]
        samples = _rows(csv_dir / f"{f.stem}.samples.csv")
        assert len(samples) == sum(len(t["samples"]) for t in data["targets"]), f.name
        assert _rows(csv_dir / f"{f.stem}.phases.csv") and (csv_dir / f"{f.stem}.differences.csv").exists()
    stages = json.loads((out / "verify.json").read_text())["data"]["stages"]
    assert [s["name"] for s in _rows(csv_dir / "verify.verify_stages.csv")] == [s["name"] for s in stages]
    assert "wrote" in proc.stderr and str(csv_dir) in proc.stderr.replace("\n", "")


def test_csv_into_a_file_is_refused_before_anything_starts(tmp_path: Path) -> None:
    f = tmp_path / "afile"
    f.write_text("x")
    r = run_zgtool("verify", "--model", "null", "--out-dir", tmp_path / "o", "--csv", f)
    assert r.returncode == ExitCode.USAGE and "--csv" in r.stderr and r.stderr.count("\n") == 1
    assert not (tmp_path / "o").exists()

"""The one `zgtool verify --quick` run the verify tests read (test_verify_cli.py, test_verify_csv.py): one run
costs ~30 s of this machine, so it runs once for the session."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid

import pytest
from verify_run import MARK, MODEL, csv_dir, left_over

ZG = [sys.executable, "-m", "zgtool"]


@pytest.fixture(scope="session")
def quick_run(tmp_path_factory: pytest.TempPathFactory):  # noqa: ANN201
    out = tmp_path_factory.mktemp("verify") / "run"
    mark = uuid.uuid4().hex
    env = {**os.environ, MARK: mark, "PYTHONUNBUFFERED": "1", "COLUMNS": "120"}
    # --csv too (one verify run costs ~30 s here): test_verify_csv.py reads its files
    proc = subprocess.run([*ZG, "verify", "--quick", "--model", MODEL, "--out-dir", str(out), "--csv", str(csv_dir(out))],
                          capture_output=True, text=True, timeout=400, env=env)
    return proc, out, left_over(mark, out)

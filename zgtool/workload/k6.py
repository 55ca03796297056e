"""bench's side of a workload: the request bodies as one JSON array the k6 script reads as its PAYLOAD
(k6/gateway_vs_direct.js: iteration i of a scenario sends body i mod N; "stream" is set per scenario)."""

from __future__ import annotations

import atexit
import json
import shutil
import tempfile
from pathlib import Path

from zgtool.workload.bodies import k6_payloads
from zgtool.workload.model import Workload

MODEL = "default"        # what the stock k6 payloads ask for (zgtool serve answers to it)


def load_for_bench(spec: str) -> Workload:
    """--dataset for bench, loaded before anything starts (a trace's timestamps do not apply: k6 sets the
    arrival rate, so its prompts are sent at --rate)."""
    from zgtool.workload.spec import load_workload

    return load_workload(spec, max_tokens=16)


def write_payload(workload: Workload, api: str, run_dir: Path | None) -> Path:
    """The workload's request bodies for k6, in `run_dir`; without one, in a temporary folder removed when
    this process exits (the bodies are written while the options are parsed, before any run folder exists)."""
    if run_dir is None:
        folder = Path(tempfile.mkdtemp(prefix="zgtool-bench-dataset-"))
        atexit.register(shutil.rmtree, folder, True)
    else:
        folder = run_dir
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "dataset_payloads.json"
    path.write_text(json.dumps(k6_payloads(api, MODEL, workload)))
    return path

"""bench against bare URLs: the model k6 requests comes from the one detection every measuring command uses
(zgtool.latency.wire.same_model): the first model the direct target serves (a 1-token request succeeded),
checked on the gateway, written into a copy of the payload instead of its placeholder "default"."""

from __future__ import annotations

import json
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Any

from zgtool.latency.wire.detect import Detection
from zgtool.latency.wire.same_model import Detect, detect_targets
from zgtool.loadtest.config import BenchConfig
from zgtool.loadtest.scripts import payload as default_payload
from zgtool.targets import Target


def _with_model(doc: Any, model: str) -> Any:
    if isinstance(doc, list):
        return [_with_model(d, model) for d in doc]
    return {**doc, "model": model} if isinstance(doc, dict) else doc


PLACEHOLDER = "default"      # the model of k6/payloads/*.json and of dataset payloads (zgtool.workload.k6)


def _payload_path(cfg: BenchConfig) -> Path:
    return Path(cfg.payload) if cfg.payload is not None else default_payload(cfg.api)


def names_placeholder(cfg: BenchConfig) -> bool:
    """Whether every body of the payload asks for the placeholder model (detection may replace it)."""
    try:
        doc = json.loads(_payload_path(cfg).read_text())
    except (OSError, ValueError):
        return False
    bodies = doc if isinstance(doc, list) else [doc]
    return all(isinstance(b, dict) and b.get("model") == PLACEHOLDER for b in bodies)


def detect_for_bench(cfg: BenchConfig, direct: tuple[Target, bool], gateway: tuple[Target, bool] | None,
                     run_dir: Path | None, timeout_s: float = 10.0
                     ) -> tuple[BenchConfig, Target, Target | None, list[Detection]]:
    """The config with its payload's model set to the detected one, and the targets as detected (unchanged,
    with no detection, when neither is a bare URL or no model was served)."""
    asked = [direct] + ([gateway] if gateway is not None else [])
    got = detect_targets(asked, Detect(api_known=True, model_known=False, timeout_s=timeout_s))
    found = [f for _, f in got if f is not None]
    served = next((f.model for f in found if f.served), None)
    targets = [t for t, _ in got]
    if served is None:
        return cfg, targets[0], (targets[1] if gateway is not None else None), found
    source = _payload_path(cfg)
    folder = run_dir if run_dir is not None else Path(tempfile.mkdtemp(prefix="zgtool-bench-"))
    folder.mkdir(parents=True, exist_ok=True)
    out = folder / "detected_payloads.json"
    out.write_text(json.dumps(_with_model(json.loads(source.read_text()), served)))
    return replace(cfg, payload=out), targets[0], (targets[1] if gateway is not None else None), found

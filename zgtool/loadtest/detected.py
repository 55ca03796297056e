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
from zgtool.loadtest.config import BenchConfig, RampConfig
from zgtool.loadtest.scripts import payload as default_payload
from zgtool.targets import Target
from zgtool.workload.model import Workload


def _with_model(doc: Any, model: str) -> Any:
    if isinstance(doc, list):
        return [_with_model(d, model) for d in doc]
    return {**doc, "model": model} if isinstance(doc, dict) else doc


PLACEHOLDER = "default"      # the model of k6/payloads/*.json and of dataset payloads (zgtool.workload.k6)


LoadConfig = BenchConfig | RampConfig     # both carry api and payload


def _payload_path(cfg: LoadConfig) -> Path:
    return Path(cfg.payload) if cfg.payload is not None else default_payload(cfg.api)


def names_placeholder(cfg: LoadConfig) -> bool:
    """Whether every body of the payload asks for the placeholder model (detection may replace it)."""
    try:
        doc = json.loads(_payload_path(cfg).read_text())
    except (OSError, ValueError):
        return False
    bodies = doc if isinstance(doc, list) else [doc]
    return all(isinstance(b, dict) and b.get("model") == PLACEHOLDER for b in bodies)


def detect_for_bench(cfg: LoadConfig, direct: tuple[Target, bool], gateway: tuple[Target, bool] | None,
                     run_dir: Path | None, timeout_s: float = 10.0
                     ) -> tuple[LoadConfig, Target, Target | None, list[Detection]]:
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


def refit_for_bench(cfg: BenchConfig, workload: Workload, choice: str, direct: Target, run_dir: Path | None
                    ) -> tuple[BenchConfig, str]:
    """--tokenizer on bench's --dataset: the workload counted (synthetic prompts rebuilt to their exact
    lengths) on the direct target, its bodies rewritten for k6 with the direct target's model; and the note
    naming the source for the result (k6 reads no usage: the run's own token counts are not compared)."""
    from zgtool.latency.tokencount import TOKENIZE_TIMEOUT_S, _base
    from zgtool.workload.bodies import k6_payloads
    from zgtool.workload.tokens import counter_for, refit

    counter = counter_for(choice, _base(direct.url), direct.model, headers=direct.auth_headers(),
                          timeout_s=TOKENIZE_TIMEOUT_S)
    wl, counts = refit(workload, counter)
    folder = run_dir if run_dir is not None else Path(tempfile.mkdtemp(prefix="zgtool-bench-"))
    folder.mkdir(parents=True, exist_ok=True)
    out = folder / "dataset_payloads.json"
    out.write_text(json.dumps(k6_payloads(cfg.api, direct.model, wl)))
    exact = [(s.input_tokens, c) for s, c in zip(wl.specs, counts, strict=True) if s.input_tokens is not None]
    hit = f"; synthetic prompts exact: {sum(a == b for a, b in exact)}/{len(exact)}" if exact else ""
    note = (f"prompt tokens counted by {counter.source}: {sum(counts) / len(counts):.1f} on average{hit}"
            + "".join(f"; {n}" for n in counter.notes))
    return replace(cfg, payload=out), note

"""Raw k6 points (`k6 run --out csv=FILE.gz`) grouped per path and phase, in ms."""

from __future__ import annotations

import csv
import gzip
from collections import defaultdict
from pathlib import Path
from urllib.parse import parse_qsl

from zgtool.errors import UsageError
from zgtool.loadtest.summary import PHASES

Points = dict[str, dict[str, list[float]]]  # path -> phase (k6 metric name) -> values, ms
# beside http_req_duration: each value's round (k6/gateway_vs_direct.js ROUNDS), aligned with it
ROUND_KEY = "http_req_duration_round"


def read_points(path: Path) -> Points:
    """Every sample of the http_req_* trends, per `path` tag (the scripts tag each scenario)."""
    out: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    wanted = set(PHASES)
    try:
        with gzip.open(path, "rt", newline="") as f:
            for row in csv.DictReader(f):
                name = row.get("metric_name")
                if name not in wanted:
                    continue
                tags = dict(parse_qsl(row.get("extra_tags") or ""))
                where = tags.get("path") or row.get("scenario") or ""
                out[where][name].append(float(row["metric_value"]))
                if name == "http_req_duration" and "round" in tags:    # the turn it ran in (ROUNDS > 1)
                    out[where][ROUND_KEY].append(float(tags["round"]))
    except (OSError, EOFError, ValueError, KeyError, csv.Error) as exc:
        raise UsageError(f"cannot read k6 points {path}: {exc}") from exc
    return {p: dict(phases) for p, phases in out.items()}

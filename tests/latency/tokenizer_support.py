"""What the --tokenizer tests share (test_tokenizer.py, test_tokenizer_sources.py): the recorded engine answers,
a fast latency-split and a synthetic workload (each module starts zgtool's engine on dummy:tiny with
litellm_live.tiny_engine)."""

from __future__ import annotations

import json
from pathlib import Path

FIXTURES = Path(__file__).parent / "fixtures" / "engines"
FAST = ["-n", "4", "--warmup", "0", "--rounds", "1", "--json"]
SYNTH = "synthetic:input=uniform:20:70,output=fixed:2,n=4"


def recorded_body(name: str) -> object:
    """The body of a recorded answer in fixtures/engines (after its '#---' header and head)."""
    raw = (FIXTURES / name).read_text()
    return json.loads(raw[raw.index("\n\n", raw.index("#---")) + 2:])

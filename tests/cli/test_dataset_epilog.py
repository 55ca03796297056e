"""latency-split's help ends with the workload grammar in full (issue 33 item 8): every form --dataset reads,
each with one example that parses, whole on its own line at 80 columns."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from zgtest import run_zgtool

from zgtool.workload.spec import FILE_KINDS, FORMS, GEN_KINDS, LOG_KIND, load_workload

SHAREGPT = [{"conversations": [{"from": "human", "value": "What does a gateway cost?"},
                               {"from": "gpt", "value": "About a millisecond per request here."}]}]
FILES = {  # a small file of each file form, under its example's own name
    "sharegpt.json": json.dumps(SHAREGPT),
    "ShareGPT_V3.json": json.dumps(SHAREGPT),
    "prompts.jsonl": json.dumps({"prompt": "Hello there", "output_len": 4}) + "\n",
    "mooncake.jsonl": "\n".join(json.dumps({"timestamp": t, "input_length": 16, "output_length": 4, "hash_ids": [t]})
                                for t in (0, 10)) + "\n",
    "access.log": '127.0.0.1 - - [06/Dec/2026:01:00:00 +0000] "POST /v1/chat/completions HTTP/1.1" 200 310 "-" '
                  '"zgtool" 0.012 0.010\n',
}


def test_every_kind_the_parser_reads_has_a_form_with_an_example() -> None:
    kinds = {kind for kind, *_ in FORMS}
    assert kinds == {"FILE", *FILE_KINDS, *GEN_KINDS, LOG_KIND}
    assert all(example for *_, example in FORMS)


@pytest.mark.parametrize("form", FORMS, ids=[f[1] for f in FORMS])
def test_each_forms_example_loads(form: tuple[str, str, str, str], tmp_path: Path,
                                  monkeypatch: pytest.MonkeyPatch) -> None:
    kind, _, _, example = form
    for name, text in FILES.items():
        (tmp_path / name).write_text(text)
    monkeypatch.chdir(tmp_path)
    spec = f"{LOG_KIND}:nginx:access.log" if kind == LOG_KIND else example   # the example's path is the server's
    workload = load_workload(spec, num_requests=6, max_tokens=8)
    assert workload.specs


def test_latency_split_help_shows_every_form_whole_at_80_columns() -> None:
    r = run_zgtool("latency-split", "--help", columns=80)
    assert r.returncode == 0, r.stderr
    assert "…" not in r.stdout
    lines = [ln.strip() for ln in r.stdout.splitlines()]
    assert "Workload forms (--dataset SPEC), one example each:" in lines
    for _, grammar, what, example in FORMS:
        assert grammar in lines and what in lines and f"--dataset {example}" in lines, example

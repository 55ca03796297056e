"""Bad input: one line naming the file and line, UsageError (exit 2), checked before anything is sent."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from zgtool.errors import UsageError
from zgtool.workload.spec import load_workload

GOOD = json.dumps({"prompt": "hi", "output_len": 3})
TRACE = '{"timestamp": %d, "input_length": 10, "output_length": 2}'

CASES = {
    # name: (file name, content, spec prefix, expected line, words the message must hold)
    "row without a prompt": ("rows.jsonl", f"{GOOD}\n{json.dumps({'output_len': 3})}\n", "", 2, "no prompt"),
    "messages without a user": ("rows.jsonl", GOOD + "\n" + json.dumps(
        {"messages": [{"role": "system", "content": "x"}]}) + "\n", "jsonl:", 2, "no user message"),
    "negative output length": ("rows.jsonl", f"{GOOD}\n{GOOD}\n" + json.dumps({"prompt": "a", "output_len": -3}),
                               "", 3, "at least 1"),
    "trace out of order": ("t.jsonl", "\n".join([TRACE % 0, TRACE % 900, TRACE % 300]), "trace:", 3,
                           "out of order"),
    "trace negative length": ("t.jsonl", TRACE % 0 + "\n" + '{"timestamp": 5, "input_length": -8, '
                              '"output_length": 2}', "trace:", 2, "negative"),
    "empty file": ("empty.jsonl", "  \n\n", "", 1, "empty"),
    "bad json line": ("rows.jsonl", f"{GOOD}\n{GOOD}\n{{\"prompt\": \"x\",\n", "", 3, "bad JSON"),
    "bad json array": ("rows.json", '[\n {"prompt": "a"},\n {"prompt": "b",}\n]', "", 3, "bad JSON"),
    "row not an object": ("rows.jsonl", f"{GOOD}\n[1, 2]\n", "", 2, "JSON object"),
    "sharegpt row without conversations": ("sg.json", '[\n {"conversations": [{"from": "human", "value": "q"}, '
                                           '{"from": "gpt", "value": "a"}]},\n\n {"id": 2}\n]', "sharegpt:", 4,
                                           "conversations"),
}


@pytest.mark.parametrize("case", list(CASES), ids=list(CASES))
def test_bad_file_names_file_and_line(tmp_path: Path, case: str) -> None:
    name, content, prefix, line, words = CASES[case]
    p = tmp_path / name
    p.write_text(content)
    with pytest.raises(UsageError) as err:
        load_workload(f"{prefix}{p}")
    msg = err.value.message
    assert f"{p}:{line}:" in msg, msg
    assert words in msg, msg
    assert "\n" not in msg


def test_missing_file_is_a_usage_error(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="no such file"):
        load_workload(str(tmp_path / "nope.jsonl"))

"""Mooncake trace replay: offsets from the timestamps (both field spellings), the speed-up applied, and
repeated hash_ids giving identical prefix blocks."""

from __future__ import annotations

import json
from pathlib import Path

from zgtool.workload.spec import load_workload
from zgtool.workload.trace import prompt_for

ROWS = [
    {"timestamp": 0, "input_length": 40, "output_length": 5, "hash_ids": [0, 1, 2]},
    {"timestamp": 500, "input_length": 40, "output_length": 6, "hash_ids": [0, 1, 3]},
    {"timestamp": 500, "input_length": 20, "output_length": 7, "hash_ids": [0, 4]},
    {"timestamp": 1800, "input_length": 35, "output_length": 8},
]


def _write(tmp_path: Path, rows: list[dict], name: str = "trace.jsonl") -> Path:
    p = tmp_path / name
    p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return p


def test_offsets_monotonic_and_speedup_applied(tmp_path: Path) -> None:
    p = _write(tmp_path, ROWS)
    wl = load_workload(str(p))                       # told apart from a JSONL by its input_length field
    assert wl.kind == "trace" and wl.offsets_s == (0.0, 0.5, 0.5, 1.8)
    fast = load_workload(f"trace:{p}", speedup=4.0)
    assert fast.offsets_s == (0.0, 0.125, 0.125, 0.45)
    assert load_workload(f"trace:{p},speedup=2").offsets_s == (0.0, 0.25, 0.25, 0.9)
    assert [s.max_tokens for s in wl.specs] == [5, 6, 7, 8]


def test_timestamp_ms_spelling_is_read_the_same(tmp_path: Path) -> None:
    rows = [{("timestamp_ms" if k == "timestamp" else k): v for k, v in r.items()} for r in ROWS]
    assert load_workload(f"trace:{_write(tmp_path, rows)}").offsets_s == (0.0, 0.5, 0.5, 1.8)


def test_repeated_hash_ids_give_identical_prefix_blocks(tmp_path: Path) -> None:
    wl = load_workload(f"trace:{_write(tmp_path, ROWS)},block=16")
    w = [s.messages[0][1].split() for s in wl.specs]
    assert [len(x) for x in w] == [40, 40, 20, 35]   # input_length words (~tokens)
    assert w[0][:32] == w[1][:32]                    # blocks 0 and 1 shared
    assert w[0][32:] != w[1][32:]                    # block 2 vs block 3
    assert w[2][:16] == w[0][:16] and w[2][16:] != w[0][16:20]
    assert w[3][:16] != w[0][:16]                    # no hash ids: its own text


def test_block_text_depends_on_the_hash_id_only() -> None:
    a = prompt_for(600, [7, 8], 512, "row-a")
    b = prompt_for(520, [7, 9], 512, "row-b")
    assert a.split()[:512] == b.split()[:512] and a.split()[512:520] != b.split()[512:520]
    assert prompt_for(1000, [1], 512, "x").split()[:512] == prompt_for(512, [1], 512, "y").split()


def test_split_prepare_sizes_the_run_from_the_trace(tmp_path: Path) -> None:
    import pytest

    from zgtool.errors import UsageError
    from zgtool.workload.split import prepare

    p = _write(tmp_path, ROWS)
    sw = prepare(f"trace:{p}", requests=None, concurrency=1, rate=None, speedup=2.0, max_tokens=16)
    assert sw.num_requests == 4 and sw.schedule_s == (0.0, 0.25, 0.25, 0.9)
    assert "trace trace.jsonl: 4 distinct request(s), 4 sent per target" in sw.summary()
    assert prepare(f"trace:{p}", requests=2, concurrency=1, rate=None, speedup=1.0,
                   max_tokens=16).schedule_s == (0.0, 0.5)
    for kwargs, words in (({"requests": 9}, "only 4"), ({"concurrency": 4}, "-c does not apply"),
                          ({"rate": "5"}, "--rate does not apply")):
        args = {"requests": None, "concurrency": 1, "rate": None, "speedup": 1.0, "max_tokens": 16, **kwargs}
        with pytest.raises(UsageError, match=words):
            prepare(f"trace:{p}", **args)
    with pytest.raises(UsageError, match="--speedup applies to a trace"):
        prepare("synthetic:input=fixed:4,output=fixed:2", requests=None, concurrency=1, rate=None, speedup=2.0,
                max_tokens=16)

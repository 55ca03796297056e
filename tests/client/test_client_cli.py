"""`zgtool client ask` end to end: a real subprocess against a real scripted server."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from scripted_llm_server import ScriptedServer, Step, free_port
from zgtest import run_zgtool

ROOT = Path(__file__).resolve().parents[2]


def zgtool(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return run_zgtool(*args, cwd=cwd, timeout_s=60)


def test_ask_json_reports_every_attempt_and_the_load_hint(scripted: ScriptedServer, tmp_path: Path) -> None:
    hint = json.dumps({"kv_util": 0.25, "running": 1, "waiting": 0})
    scripted.script(Step(429, {"retry-after-ms": "20"}), Step(200, {"x-gpu-load-hint": hint}))
    out_file = tmp_path / "ask.json"
    proc = zgtool("client", "ask", scripted.url, "hello", "--json", "-o", str(out_file), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["schema"] == "zgtool.result/1" and doc["kind"] == "client.ask"
    data = doc["data"]
    assert data["ok"] and data["text"] == "hello there" and data["num_attempts"] == 2
    assert [a["status"] for a in data["attempts"]] == [429, 200] and data["attempts"][0]["wait_s"] == 0.02
    assert data["load_hint"]["kv_util"] == 0.25 and data["load_hint_util_pct"] == 25.0
    assert json.loads(out_file.read_text())["data"]["attempts"] == data["attempts"]


def test_ask_stream_shows_text_attempts_model_and_hint(scripted: ScriptedServer, tmp_path: Path) -> None:
    hint = json.dumps({"kv_util": 0.5, "running": 2, "waiting": 1})
    scripted.script(Step(529), Step(200, {"x-gpu-load-hint": hint}))
    proc = zgtool("client", "ask", scripted.url, "hello", "--stream", "--model", "big", "--fallback", "small",
                  cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("Hello!\n")
    assert "attempts" in proc.stdout and "overloaded_error" in proc.stdout
    assert "model: big" in proc.stdout and "load hint: kv_util=0.5, running=2, waiting=1" in proc.stdout
    assert [s.body["stream"] for s in scripted.seen] == [True, True]


def test_unknown_target_exits_2_listing_known_names(tmp_path: Path) -> None:
    proc = zgtool("client", "ask", "nowhere", "hi", cwd=tmp_path)
    assert proc.returncode == 2 and "unknown target 'nowhere'" in proc.stderr and "local" in proc.stderr


def test_refused_port_exits_3_after_the_attempts(tmp_path: Path) -> None:
    proc = zgtool("client", "ask", f"http://127.0.0.1:{free_port()}", "hi", "--max-attempts", "2", cwd=tmp_path)
    assert proc.returncode == 3, proc.stderr
    assert "request failed after 2 attempt(s)" in proc.stderr and "Traceback" not in proc.stderr


def test_a_400_exits_2_without_retrying(scripted: ScriptedServer, tmp_path: Path) -> None:
    scripted.script(Step(400))
    proc = zgtool("client", "ask", scripted.url, "hi", cwd=tmp_path)
    assert proc.returncode == 2 and "not retried" in proc.stderr and len(scripted.seen) == 1


def test_bad_policy_options_exit_2_with_one_line(tmp_path: Path) -> None:
    proc = zgtool("client", "ask", "http://127.0.0.1:1", "hi", "--fallback", "small", "--util-threshold", "150",
                  cwd=tmp_path)
    assert proc.returncode == 2 and "util_threshold_pct" in proc.stderr and "Traceback" not in proc.stderr
    proc = zgtool("client", "ask", "http://127.0.0.1:1", "hi", "--api", "grpc", cwd=tmp_path)
    assert proc.returncode == 2 and "--api must be one of" in proc.stderr


def test_an_anthropic_target_given_with_its_v1_is_asked_at_v1_messages(scripted: ScriptedServer,
                                                                         tmp_path: Path) -> None:
    """The README's URL form (…/v1): the Anthropic SDK appends /v1/messages itself, so the client hands it the
    URL before the /v1 (it asked /v1/v1/messages, a 404 on every engine)."""
    scripted.script(Step(200, {}))
    proc = zgtool("client", "ask", scripted.url + "/v1", "hello", "--json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["data"]["text"] == "hello there"
    assert [s.path for s in scripted.seen] == ["/v1/messages"]


def test_a_bare_url_is_asked_for_the_model_it_lists_without_a_request_beforehand(tmp_path: Path) -> None:
    from replay_servers import running

    with running("openai-only", "served-model") as url:        # 404 for any other model, as vLLM
        proc = zgtool("client", "ask", url, "hi", "--api", "openai", "--json", cwd=tmp_path)
        named = zgtool("client", "ask", url, "hi", "--api", "openai", "--model", "other", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["data"]["ok"] and doc["data"]["num_attempts"] == 1 and doc["target"]["model"] == "served-model"
    assert doc["target"]["detected"].startswith("model 'served-model' (GET /v1/models lists 'served-model')")
    assert named.returncode == 2 and "The model `other` does not exist" in named.stderr     # --model is kept

"""latency-split --dataset against a real `zgtool serve --model dummy:small`: per-request prompts, the
prefix-cache hit rate read back from /metrics, a trace replayed on its schedule, and bad input refused
before anything is sent."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from workload_helpers import Listener
from zgtest import run_zgtool

pytestmark = pytest.mark.slow


def _split(engine: str, tmp_path: Path, *args: str) -> tuple[int, dict, str]:
    out = tmp_path / "split.json"
    r = run_zgtool("latency-split", engine, "--api", "openai", "--model", "default", "-q", "--warmup", "1",
                   "-o", out, *args, timeout_s=240)
    data = json.loads(out.read_text())["data"] if out.exists() else {}
    return r.returncode, data, r.stdout + r.stderr


def test_dataset_rows_each_send_their_own_prompt(engine: str, tmp_path: Path) -> None:
    rows = tmp_path / "rows.jsonl"
    rows.write_text("".join(json.dumps({"prompt": " ".join(["word"] * (3 + 7 * i)), "output_len": 2 + i % 3}) + "\n"
                            for i in range(6)))
    rc, data, text = _split(engine, tmp_path, "--dataset", str(rows), "--no-stream")
    assert rc == 0, text
    assert data["config"]["num_requests"] == 6 and data["config"]["workload"]["kind"] == "jsonl"
    samples = sorted(data["targets"][0]["samples"], key=lambda s: s["index"])
    assert all(s["ok"] for s in samples)
    prompt_tokens = [s["input_tokens"] for s in samples]
    assert prompt_tokens == sorted(prompt_tokens) and len(set(prompt_tokens)) == 6   # longer row, more tokens
    assert [s["output_tokens"] for s in samples] == [2 + i % 3 for i in range(6)]    # each row's output_len


def test_shared_prefix_run_reports_a_prefix_cache_hit_rate(engine: str, tmp_path: Path) -> None:
    # the engine twice (an A/A run): one /metrics, a delta per target's blocks
    rc, data, text = _split(engine, tmp_path, engine, "--dataset",
                            "shared-prefix:groups=2,prefix=96,suffix=6,output=3", "-n", "8")
    assert rc == 0, text
    (pc,) = data["prefix_cache"]
    assert pc["url"] == f"{engine}/metrics" and pc["source"] == "zgtool"
    assert pc["query_tokens"] > 0 and pc["hit_rate"] > 0
    names = [t["name"] for t in data["targets"]]
    assert set(pc["targets"]) == set(names) and len(names) == 2
    assert all(t["hit_rate"] > 0 for t in pc["targets"].values())
    per_target = sum(t["query_tokens"] for t in pc["targets"].values())
    assert per_target == pc["query_tokens"]
    tokens = sum(s["input_tokens"] for t in data["targets"] for s in t["samples"])
    assert pc["query_tokens"] == tokens      # the measured requests' prompts only: warm-ups left out
    assert "prefix-cache hit rate" in text


def test_trace_is_replayed_on_its_schedule(engine: str, tmp_path: Path) -> None:
    trace = tmp_path / "mooncake.jsonl"
    stamps = [0, 400, 400, 1200]
    trace.write_text("".join(json.dumps({"timestamp": t, "input_length": 24, "output_length": 2,
                                         "hash_ids": [5, 6 + i]}) + "\n" for i, t in enumerate(stamps)))
    rc, data, text = _split(engine, tmp_path, "--dataset", f"trace:{trace},block=16", "--speedup", "2")
    assert rc in (0, 5), text      # 5: this busy machine's client fell behind the schedule (flagged, not hidden)
    assert data["config"]["open_loop"]["arrivals"] == "schedule" and data["config"]["rounds"] == 1
    assert data["config"]["workload"]["duration_s"] == 0.6
    samples = sorted(data["targets"][0]["samples"], key=lambda s: s["index"])
    assert len(samples) == 4 and all(s["ok"] for s in samples)
    assert (pc := data["prefix_cache"]) and pc[0]["hit_tokens"] > 0   # hash id 5's block is shared


def test_bad_dataset_exits_2_naming_file_and_line_and_sends_nothing(listener: Listener, tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"prompt": "ok"}) + "\n" + json.dumps({"output_len": 4}) + "\n")
    r = run_zgtool("latency-split", f"http://127.0.0.1:{listener.port}", "--dataset", str(bad))
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and f"{bad}:2:" in lines[0] and "no prompt" in lines[0]
    assert listener.accepted == 0


def test_trace_out_of_order_exits_2_and_sends_nothing(listener: Listener, tmp_path: Path) -> None:
    bad = tmp_path / "t.jsonl"
    bad.write_text('{"timestamp": 10, "input_length": 3, "output_length": 1}\n'
                   '{"timestamp": 5, "input_length": 3, "output_length": 1}\n')
    r = run_zgtool("latency-split", f"http://127.0.0.1:{listener.port}", "--dataset", f"trace:{bad}")
    assert r.returncode == 2 and f"{bad}:2:" in r.stderr and "out of order" in r.stderr
    assert listener.accepted == 0


def test_metrics_url_without_a_dataset_reports_the_hit_rate(engine: str, tmp_path: Path) -> None:
    rc, data, text = _split(engine, tmp_path, "-n", "4", "--prompt", "medium", "--max-tokens", "2",
                            "--metrics-url", f"{engine}/metrics")
    assert rc == 0, text
    (pc,) = data["prefix_cache"]
    assert pc["query_tokens"] > 0 and pc["hit_rate"] > 0     # one prompt four times: its blocks are reused


def test_https_engine_metrics_read_with_the_run_trust_settings(tls_engine: str, tmp_path: Path) -> None:
    out = tmp_path / "split.json"
    r = run_zgtool("latency-split", tls_engine, "-k", "-q", "--warmup", "1", "-o", out,
                   "--dataset", "shared-prefix:groups=1,prefix=64,suffix=4,output=2", "-n", "4", timeout_s=180)
    assert r.returncode == 0, r.stdout + r.stderr
    (pc,) = json.loads(out.read_text())["data"]["prefix_cache"]
    assert pc["url"] == f"{tls_engine}/metrics" and pc["query_tokens"] > 0

"""--dataset on bench (k6 sends the rows in turn) and verify (its latency-split and k6 stages take the
dataset's prompts), against a real `zgtool serve --model dummy:small`; bad input exits 2 with nothing sent."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from workload_helpers import Listener, metric
from zgtest import run_zgtool

pytestmark = pytest.mark.slow

ROWS = [{"prompt": "alpha beta", "output_len": 1}, {"prompt": "gamma delta epsilon", "output_len": 5}]


def _k6_or_skip() -> None:
    from zgtool.errors import MissingCapability
    from zgtool.loadtest.k6bin import find_k6

    try:
        find_k6(None)
    except MissingCapability as exc:
        pytest.skip(str(exc))


def test_bench_dataset_rows_are_sent_in_turn(engine: str, tmp_path: Path) -> None:
    _k6_or_skip()
    rows = tmp_path / "two.jsonl"
    rows.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    done0, gen0 = metric(engine, "zg_e2e_request_latency_seconds_count"), metric(engine, "zg_generation_tokens_total")
    r = run_zgtool("bench", "--direct", engine, "--api", "openai", "--scenarios", "direct", "--rate", "4",
                   "--duration", "2s", "--dataset", str(rows), "-q", "-o", tmp_path / "bench.json",
                   "--run-dir", tmp_path / "run", timeout_s=180)
    assert r.returncode == 0, r.stdout + r.stderr
    n = int(metric(engine, "zg_e2e_request_latency_seconds_count") - done0)
    gen = metric(engine, "zg_generation_tokens_total") - gen0
    assert n >= 4
    # iteration i sends row i mod 2: 1 and 5 output tokens in turn (the stock payload would give 16 each);
    # before k6, the model detection sent d 1-token requests (one per API route it tried), counted alike
    assert any(gen == d + sum(1 if i % 2 == 0 else 5 for i in range(n - d)) for d in range(0, 5)), (n, gen)
    sent = json.loads((tmp_path / "run" / "dataset_payloads.json").read_text())
    assert [b["messages"][0]["content"] for b in sent] == [r["prompt"] for r in ROWS]


def test_bench_with_a_dataset_and_no_run_dir_leaves_no_file_behind(engine: str, tmp_path: Path) -> None:
    _k6_or_skip()
    rows, scratch = tmp_path / "two.jsonl", tmp_path / "tmp"
    rows.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    scratch.mkdir()
    r = run_zgtool("bench", "--direct", engine, "--api", "openai", "--scenarios", "direct", "--rate", "4",
                   "--duration", "1s", "--dataset", str(rows), "-q", "-o", tmp_path / "bench.json",
                   env={"TMPDIR": str(scratch)}, timeout_s=180)
    assert r.returncode == 0, r.stdout + r.stderr
    assert list(scratch.iterdir()) == []        # neither the request bodies nor k6's run folder stayed


def test_bench_bad_dataset_exits_2_and_sends_nothing(listener: Listener, tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps(ROWS[0]) + "\n" + json.dumps({"prompt": "x", "output_len": -2}) + "\n")
    r = run_zgtool("bench", "--direct", f"http://127.0.0.1:{listener.port}", "--scenarios", "direct",
                   "--dataset", str(bad))
    assert r.returncode == 2 and f"{bad}:2:" in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert listener.accepted == 0


def test_verify_stages_take_the_dataset(engine: str, tmp_path: Path) -> None:
    from zgtool.targets import Target
    from zgtool.verify.plan import Plan, SplitRun, VerifyConfig
    from zgtool.verify.stages import latency_split

    rows = tmp_path / "rows.jsonl"
    rows.write_text("".join(json.dumps({"prompt": "w " * (2 + 5 * i), "output_len": 2}) + "\n" for i in range(4)))
    vcfg = VerifyConfig(model="dummy:small", quick=True, dataset=str(rows), requests=4)
    plan = Plan.for_config(vcfg)
    assert plan.dataset == str(rows)
    target = Target("direct", engine, "openai", "default")
    result = latency_split([target], SplitRun("stream-c1", True, 1, 4), plan, vcfg)
    data = result["data"]
    assert data["config"]["workload"]["kind"] == "jsonl" and "--dataset" in result["command"]
    tokens = [s["input_tokens"] for s in sorted(data["targets"][0]["samples"], key=lambda s: s["index"])]
    assert len(set(tokens)) == 4 and tokens == sorted(tokens)
    (pc,) = data["prefix_cache"]                       # read from the engine's /metrics beside the latency
    assert pc["url"] == f"{engine}/metrics" and pc["query_tokens"] == sum(tokens)


def test_verify_stage_k6_sends_the_dataset(engine: str, tmp_path: Path) -> None:
    _k6_or_skip()
    from zgtool.targets import Target
    from zgtool.verify.plan import Plan, VerifyConfig
    from zgtool.verify.stages import k6_bench

    rows = tmp_path / "two.jsonl"
    rows.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    plan = Plan.for_config(VerifyConfig(model="dummy:small", quick=True, dataset=str(rows)))
    t = Target("engine", engine, "anthropic", "default")
    result = k6_bench(t, t, plan, tmp_path / "k6")
    assert result["data"]["requests"] > 0 and result["data"]["failures"] == 0
    assert Path(result["data"]["config"]["payload"]).name == "dataset_payloads.json"


def test_verify_bad_dataset_exits_2_before_starting_anything(tmp_path: Path) -> None:
    bad = tmp_path / "empty.jsonl"
    bad.write_text("")
    r = run_zgtool("verify", "--model", "null", "--dataset", str(bad), "--out", tmp_path / "out")
    assert r.returncode == 2 and f"{bad}:1:" in r.stderr and "empty" in r.stderr, r.stderr
    assert not (tmp_path / "out").exists()

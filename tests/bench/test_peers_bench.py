"""bench/peers.py: its parsing and ratio code, and one tiny real run (zgtool alone, peers that
are not installed reported as skipped) so the benchmark cannot silently rot."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("bench_peers", ROOT / "bench" / "peers.py")
assert _spec is not None and _spec.loader is not None
peers = importlib.util.module_from_spec(_spec)
sys.modules["bench_peers"] = peers
_spec.loader.exec_module(peers)


def _summary(engine: str, tok: float, tok1: float, ttft: float) -> object:
    return peers.EngineSummary(engine, "float32", 3, tok, tok1, ttft, ttft * 2, 10.0, ttft / 2, 5.0, 500.0, 2.0, 0)


def test_sse_lines_parse_to_chunks_and_everything_else_is_ignored() -> None:
    assert peers.parse_sse_chunk('data: {"choices": [{"delta": {"content": "a"}}]}') == {
        "choices": [{"delta": {"content": "a"}}]}
    assert peers.parse_sse_chunk("data:[DONE]") is None
    assert peers.parse_sse_chunk("data: [DONE]") is None
    assert peers.parse_sse_chunk(": keep-alive") is None
    assert peers.parse_sse_chunk("event: zgtool_timing") is None
    assert peers.parse_sse_chunk("data: not json") is None
    assert peers.parse_sse_chunk("data: [1, 2]") is None


def test_ratios_are_zgtool_over_peer_and_missing_figures_give_none() -> None:
    ours, peer = _summary("zgtool", 200.0, 50.0, 100.0), _summary("vllm", 100.0, 100.0, 50.0)
    r = peers.ratios(ours, peer)
    assert r["c_tok_s"] == 2.0 and r["c1_tok_s"] == 0.5 and r["c_ttft_p50"] == 2.0
    nan_peer = _summary("llama", 0.0, float("nan"), 50.0)
    r2 = peers.ratios(ours, nan_peer)
    assert r2["c_tok_s"] is None and r2["c1_tok_s"] is None


def test_cycles_alternate_and_zgtool_opens_the_first() -> None:
    names = ["zgtool", "vllm", "llama"]
    assert peers.cycle_order(names, 0) == names
    assert peers.cycle_order(names, 1) == names[::-1]
    assert peers.cycle_order(names, 2) == names


def test_peer_lists_parse_and_unknown_names_are_refused() -> None:
    assert peers.parse_peers("none") == []
    assert peers.parse_peers("all") == ["vllm", "llama", "transformers"]
    assert peers.parse_peers("vllm, llama") == ["vllm", "llama"]
    with pytest.raises(SystemExit):
        peers.parse_peers("sglang")


def test_equal_lengths_are_asked_where_the_server_takes_them() -> None:
    case = peers.ModelCase("dummy:small", Path("/x"), None, "none")
    z = peers.zgtool_spec(case, 1, 2, "float32", "--num-threads")
    body = peers.body_for(z, "hi", 32)
    assert body["ignore_eos"] is True and body["temperature"] == 0 and body["max_tokens"] == 32
    assert "--num-threads" in z.argv
    v = peers.ServerSpec("vllm", (), {}, "/v1/models", "m", {"ignore_eos": True, "min_tokens": 0}, True, "float32")
    assert peers.body_for(v, "hi", 32)["min_tokens"] == 32


def test_render_prints_figures_ratios_and_one_skip_line_per_missing_peer() -> None:
    ours, peer = _summary("zgtool", 200.0, 50.0, 100.0), _summary("vllm", 100.0, 100.0, 50.0)
    text = peers.render("dummy:small", 16, [ours, peer], [peers.Skip("llama", "skipped: not installed (x)")],
                        {"vllm": peers.ratios(ours, peer)})
    assert "zgtool/vllm: tok/s c=16 x2.00" in text
    assert "llama        skipped: not installed (x)" in text


def test_process_tree_rss_counts_this_process() -> None:
    assert peers.tree_rss_mb(os.getpid()) > 1.0


@pytest.mark.slow
def test_tiny_run_measures_zgtool_and_skips_peers_that_are_not_installed(tmp_path: Path) -> None:
    env = {**os.environ, "ZGTOOL_CACHE_DIR": str(tmp_path / "cache")}  # no peers installed there
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "peers.py"), "--models", "dummy:tiny", "--peers", "vllm,llama",
         "--cycles", "1", "--concurrency", "2", "--max-tokens", "4", "--c1-requests", "1", "--threads", "1"],
        capture_output=True, text=True, env=env, timeout=240, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = proc.stdout.strip().splitlines()
    result = json.loads(lines[-1])
    (model,) = result["models"]
    (engine,) = model["engines"]
    assert engine["engine"] == "zgtool" and engine["c_tok_s"] > 0 and engine["errors"] == 0
    assert set(model["skipped"]) == {"vllm", "llama"}
    assert all("not installed (run bench/setup_peers.sh)" in r for r in model["skipped"].values())
    assert model["ratios_zgtool_over_peer"] == {}
    assert sum("skipped: not installed" in ln for ln in lines[:-1]) == 2  # one table line each


def test_setup_script_parses_its_options_without_installing_anything(tmp_path: Path) -> None:
    env = {**os.environ, "ZGTOOL_CACHE_DIR": str(tmp_path)}
    ok = subprocess.run(["bash", str(ROOT / "bench" / "setup_peers.sh"), "--help"], capture_output=True, text=True,
                        env=env, timeout=30)
    assert ok.returncode == 0 and "--only vllm" in ok.stdout
    bad = subprocess.run(["bash", str(ROOT / "bench" / "setup_peers.sh"), "--bogus"], capture_output=True, text=True,
                         env=env, timeout=30)
    assert bad.returncode == 2 and "unknown argument" in bad.stderr
    assert not (tmp_path / "peers").exists()

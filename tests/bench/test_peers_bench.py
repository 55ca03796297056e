"""bench/peers.py: its parsing and ratio code, and one tiny real run (zgtool alone, peers that
are not installed reported as skipped) so the benchmark cannot silently rot."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("bench_peers", ROOT / "bench" / "peers.py")
assert _spec is not None and _spec.loader is not None
peers = importlib.util.module_from_spec(_spec)
sys.modules["bench_peers"] = peers
_spec.loader.exec_module(peers)
import peers_gguf  # noqa: E402  (bench/peerlib/ is on sys.path once peers.py is loaded)
import peers_llama_server  # noqa: E402


def _summary(engine: str, tok: float, tok1: float, ttft: float) -> Any:
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
    assert peers.parse_peers("all") == ["vllm", "llama", "llama-server", "transformers"]
    assert peers.parse_peers("vllm, llama") == ["vllm", "llama"]
    with pytest.raises(SystemExit):
        peers.parse_peers("sglang")


def test_equal_lengths_are_asked_where_the_server_takes_them() -> None:
    case = peers.ModelCase("dummy:small", Path("/x"), None, None, "none")
    z = peers.zgtool_spec(case, 1, 2, "float32", "--num-threads")
    body = peers.body_for(z, "hi", 32)
    assert body["ignore_eos"] is True and body["temperature"] == 0 and body["max_tokens"] == 32
    assert "--num-threads" in z.argv
    v = peers.ServerSpec("vllm", (), {}, "/v1/models", "m", {"ignore_eos": True, "min_tokens": 0}, True, "float32")
    assert peers.body_for(v, "hi", 32)["min_tokens"] == 32
    assert body["stream_options"] == {"include_usage": True}


def test_render_prints_figures_ratios_and_one_skip_line_per_missing_peer() -> None:
    ours, peer = _summary("zgtool", 200.0, 50.0, 100.0), _summary("vllm", 100.0, 100.0, 50.0)
    text = peers.render("dummy:small", 16, [ours, peer], [peers.Skip("llama", "skipped: not installed (x)")],
                        {"vllm": peers.ratios(ours, peer)})
    assert "zgtool/vllm: tok/s c=16 x2.00" in text
    assert "llama             skipped: not installed (x)" in text


def test_process_tree_rss_counts_this_process() -> None:
    assert peers.tree_rss_mb(os.getpid()) > 1.0


@pytest.mark.slow
def test_tiny_run_measures_zgtool_and_skips_peers_that_are_not_installed(tmp_path: Path) -> None:
    env = {**os.environ, "ZGTOOL_CACHE_DIR": str(tmp_path / "cache")}  # no peers installed there
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "peers.py"), "--models", "dummy:tiny", "--peers", "vllm,llama",
         "--cycles", "1", "--concurrency", "2", "--max-tokens", "4", "--c1-requests", "1", "--threads", "1",
         "--dtypes", "same", "--zgtool-rows", "auto"],
        capture_output=True, text=True, env=env, timeout=240, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = proc.stdout.strip().splitlines()
    result = json.loads(lines[-1])
    (model,) = result["models"]
    engine, auto = model["engines"]
    assert engine["engine"] == "zgtool" and engine["c_tok_s"] > 0 and engine["errors"] == 0
    assert auto["engine"] == "zgtool:auto" and auto["dtype"] == "auto" and auto["errors"] == 0
    assert "avx2" in result["cpu_flags"] and len(engine["load_avg_1m_runs"]) == 1
    assert result["cpu"] and result["cpu"] != "unknown"
    assert set(model["skipped"]) == {"vllm", "llama"}
    assert all("not installed (run bench/setup_peers.sh)" in r for r in model["skipped"].values())
    assert model["ratios_zgtool_over_peer"] == {}
    assert sum("skipped: not installed" in ln for ln in lines[:-1]) == 2  # one table line each


def test_setup_script_parses_its_options_without_installing_anything(tmp_path: Path) -> None:
    env = {**os.environ, "ZGTOOL_CACHE_DIR": str(tmp_path)}
    ok = subprocess.run(["bash", str(ROOT / "bench" / "setup_peers.sh"), "--help"], capture_output=True, text=True,
                        env=env, timeout=30)
    assert ok.returncode == 0 and "--only vllm" in ok.stdout and "--llama-server" in ok.stdout
    bad = subprocess.run(["bash", str(ROOT / "bench" / "setup_peers.sh"), "--bogus"], capture_output=True, text=True,
                         env=env, timeout=30)
    assert bad.returncode == 2 and "unknown argument" in bad.stderr
    assert not (tmp_path / "peers").exists()


# -- dtype variants, llama-server ------------------------------------------------------------
def _args(*argv: str) -> Any:
    return peers.build_parser().parse_args(["--threads", "2", *argv])


def _case(tmp: Path) -> Any:
    same = peers.GgufFile("f32", tmp / "m.f32.gguf", "converted")
    best = peers.GgufFile("Q4_1", tmp / "m.Q4_1.gguf", "packaged")
    return peers.ModelCase("smollm2", tmp, same, best, "")


def test_dtype_variants_parse_in_a_fixed_order_and_unknown_ones_are_refused() -> None:
    assert peers.parse_dtypes("best,same") == ["same", "best"]
    assert peers.parse_dtypes("same") == ["same"]
    with pytest.raises(SystemExit):
        peers.parse_dtypes("fastest")
    assert _args().dtypes == ["same", "best"] and _args("--dtypes", "best").dtypes == ["best"]


def test_zgtool_best_row_is_int8_once_serve_offers_it_and_bfloat16_before() -> None:
    assert peers.zgtool_best_dtype("--dtype auto | float32 | bfloat16 | float16") == "bfloat16"
    assert peers.zgtool_best_dtype("--dtype auto | float32 | bfloat16 | float16 | int8") == "int8"
    assert peers.zgtool_best_dtype("int8", "bfloat16") == "bfloat16"
    boxed = ("│ --dtype        TEXT  auto | float32 | bfloat16 |  │\n│                      float16 | int8    │\n"
             "│ --kv-cache     TEXT  int8 blocks      │\n")
    assert peers.zgtool_best_dtype(boxed) == "int8"
    assert peers.zgtool_best_dtype(boxed.replace(" | int8", "")) == "bfloat16"  # int8 of another option
    case = peers.ModelCase("dummy:small", Path("/x"), None, None, "none")
    spec = peers.peer_spec("zgtool", "best", case, 1234, _args(), "--num-threads --dtype int8")
    assert spec.name == "zgtool:best" and spec.dtype == "int8"
    assert spec.argv[spec.argv.index("--dtype") + 1] == "int8"
    same = peers.peer_spec("zgtool", "same", case, 1234, _args(), "--num-threads")
    assert same.name == "zgtool" and same.argv[same.argv.index("--dtype") + 1] == "float32"


def test_a_best_row_equal_to_the_same_dtype_row_is_not_run_twice() -> None:
    case = peers.ModelCase("dummy:small", Path("/x"), None, None, "none")
    assert peers.peer_spec("zgtool", "best", case, 1, _args("--dtype", "bfloat16"), "") is None
    assert peers.peer_spec("vllm", "best", case, 1, _args("--dtype", "bfloat16"), "") is None
    g = peers.GgufFile("f32", Path("/x/m.gguf"), "converted")
    one = peers.ModelCase("dummy:small", Path("/x"), g, g, "")
    assert peers.peer_spec("llama-server", "best", one, 1, _args(), "") is None


def test_llama_server_gets_one_slot_per_stream_equal_threads_and_equal_lengths(tmp_path: Path) -> None:
    case = _case(tmp_path)
    for variant, gguf in (("same", case.gguf_same), ("best", case.gguf_best)):
        spec = peers.llama_server_spec(peers.row_name("llama-server", variant), gguf, "", 4321, 2, 16, 96,
                                       exe=Path("/opt/llama-server"))
        argv = list(spec.argv)
        assert argv[0] == "/opt/llama-server" and argv[argv.index("-m") + 1] == str(gguf.path)
        assert argv[argv.index("-np") + 1] == "16"
        assert int(argv[argv.index("-c") + 1]) == 16 * peers_llama_server.slot_context(96) >= 16 * (96 + 256)
        assert argv[argv.index("-t") + 1] == "2" and argv[argv.index("-tb") + 1] == "2"
        assert argv[argv.index("--poll") + 1] == "0"
        assert argv[argv.index("--port") + 1] == "4321" and spec.dtype == gguf.dtype
        body = peers.body_for(spec, "hi", 96)
        assert body["ignore_eos"] is True and body["repeat_penalty"] == 1.0 and body["temperature"] == 0
        assert body["stream_options"] == {"include_usage": True} and spec.equal_length_by_flag


def test_llama_server_is_a_skip_line_when_not_built_and_says_why_a_build_failed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ZGTOOL_CACHE_DIR", str(tmp_path))
    case = _case(tmp_path)
    skip = peers.peer_spec("llama-server", "same", case, 1, _args(), "")
    assert isinstance(skip, peers.Skip) and "not built (run bench/setup_peers.sh --llama-server)" in skip.reason
    d = tmp_path / "peers" / "llama-server"
    d.mkdir(parents=True)
    (d / "build.log").write_text("[ 50%] Building x.o\nfoo.cpp:1: error: no such thing\nmake: *** Error 1\n")
    skip = peers.peer_spec("llama-server", "best", case, 1, _args(), "")
    assert isinstance(skip, peers.Skip) and skip.name == "llama-server:best"
    assert "build not finished or failed" in skip.reason and "Error 1" in skip.reason


def test_llama_rows_take_the_same_dtype_gguf_and_the_packaged_best(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ZGTOOL_CACHE_DIR", str(tmp_path))
    (tmp_path / "peers" / "llama").mkdir(parents=True)
    (tmp_path / "peers" / "llama" / ".ok").touch()
    case = _case(tmp_path)
    same = peers.peer_spec("llama", "same", case, 1, _args(), "")
    best = peers.peer_spec("llama", "best", case, 1, _args(), "")
    assert (same.name, same.dtype) == ("llama", "f32") and str(case.gguf_same.path) in same.argv
    assert (best.name, best.dtype) == ("llama:best", "Q4_1") and str(case.gguf_best.path) in best.argv
    none = peers.ModelCase("dummy:small", tmp_path, None, None, "convert_hf_to_gguf.py failed: BPE")
    skip = peers.peer_spec("llama", "same", none, 1, _args(), "")
    assert isinstance(skip, peers.Skip) and "convert_hf_to_gguf.py failed: BPE" in skip.reason


def test_best_rows_are_compared_with_zgtools_best_and_same_rows_with_zgtool() -> None:
    z, zb = _summary("zgtool", 100.0, 10.0, 100.0), _summary("zgtool:best", 400.0, 40.0, 50.0)
    ls, lb = _summary("llama-server", 50.0, 20.0, 100.0), _summary("llama-server:best", 200.0, 40.0, 100.0)
    by = {s.engine: s for s in (z, zb, ls, lb)}
    rat = peers.pair_ratios(by)
    assert rat["llama-server"]["c_tok_s"] == 2.0 and rat["llama-server:best"]["c_tok_s"] == 2.0
    assert rat["llama-server:best"]["c1_tok_s"] == 1.0 and "zgtool:best" not in rat
    text = peers.render("smollm2", 16, [z, zb, ls, lb], [], rat)
    assert "zgtool/llama-server: tok/s c=16 x2.00" in text
    assert "zgtool:best/llama-server:best: tok/s c=16 x2.00" in text
    only_same = peers.pair_ratios({"zgtool": z, "llama-server:best": lb})
    assert only_same["llama-server:best"]["c_tok_s"] == 0.5  # against zgtool when it has no best row


def test_gguf_names_state_their_type_and_conversion_without_the_sdist_is_a_reason(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert peers_gguf.gguf_dtype_of(Path("SmolLM2-135M-Instruct.Q4_1.gguf")) == "Q4_1"
    monkeypatch.setenv("ZGTOOL_CACHE_DIR", str(tmp_path))
    got = peers_gguf.same_dtype_gguf(tmp_path / "hf", "float32", cache=True, tmp=tmp_path)
    assert isinstance(got, str) and "convert_hf_to_gguf.py not found" in got
    assert "no GGUF type" in str(peers_gguf.same_dtype_gguf(tmp_path, "int8", cache=False, tmp=tmp_path))
    argv, env = peers_gguf.convert_command(tmp_path / "hf", tmp_path / "o.gguf", "f32")
    assert argv[-2:] == ["--outtype", "f32"] and env["PYTHONPATH"].endswith("gguf-py")
    argv, _ = peers_gguf.convert_command(tmp_path / "hf", tmp_path / "o.gguf", "f32", byte_vocab=True)
    assert argv[1].endswith("bench/peerlib/peers_convert_bytes.py") and argv[2].endswith("llama.cpp")


def test_no_request_of_a_run_reuses_a_prompt_the_server_already_saw() -> None:
    prompts = list(peers.CANDIDATE_PROMPTS[:5])
    c, c1 = peers.round_prompts(prompts, 4, 3)
    assert len(c) == 4 and len(c1) == 3
    sent = [peers.WARM_PROMPT, *c, *c1]
    assert len(set(sent)) == len(sent)  # the warm-up, the c=N and the c=1 rounds: all distinct
    many_c, many_c1 = peers.round_prompts(list(peers.CANDIDATE_PROMPTS), 16, 3)
    assert not set(many_c) & set(many_c1) and set(many_c1) <= set(peers.CANDIDATE_PROMPTS)


def test_zgtool_runs_an_auto_and_a_bf16_row_compared_with_each_peers_best() -> None:
    assert peers.zgtool_extra_rows(_args()) == [("zgtool:auto", "auto"), ("zgtool:bf16", "bfloat16")]
    assert peers.zgtool_extra_rows(_args("--dtype", "bfloat16")) == [("zgtool:auto", "auto")]
    with pytest.raises(SystemExit, match="unknown --zgtool-rows"):
        peers.zgtool_extra_rows(_args("--zgtool-rows", "fastest"))
    by = {n: _summary(n, t, t / 4, 100.0) for n, t in
          (("zgtool", 100.0), ("zgtool:auto", 200.0), ("vllm", 100.0), ("vllm:best", 160.0), ("llama", 50.0))}
    rat = peers.pair_ratios(by)
    assert rat["zgtool:auto/vllm:best"]["c_tok_s"] == 1.25 and rat["zgtool:auto/llama"]["c_tok_s"] == 4.0
    assert "zgtool:auto/vllm" not in rat  # vLLM's best row stands for it


def test_per_cycle_ratio_intervals_state_their_confidence() -> None:
    iv = peers.order_interval([1.2, 1.0, 1.5, 1.1, 1.3, 1.4])
    assert (iv["median"], iv["lo"], iv["hi"], iv["cycles"], iv["confidence"]) == (1.25, 1.0, 1.5, 6, 0.969)
    assert peers.order_interval([2.0])["confidence"] is None
    assert peers.build_parser().parse_args([]).cycles == 6  # the fewest cycles whose min-max reaches 95%


def test_the_json_names_the_cpu_flags_and_each_runs_load() -> None:
    assert "avx2" in peers.cpu_flags() or not Path("/proc/cpuinfo").exists()
    fig = peers.RunFigures("zgtool", 0, 1.0, 100.0, 10.0, [1.0], [1.0], 10, 5.0, [2.0], [1.0], 0, 1.5, 2.5)
    s = peers.summarize("zgtool", "float32", [fig])
    assert s.load_avg_1m_runs == [1.5] and s.c1_ttft_p50_runs == [2.0]

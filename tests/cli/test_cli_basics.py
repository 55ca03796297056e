"""The CLI's own contract: fast help without torch, version, generate, targets, exit codes."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from zgtest import run_zgtool


def zgtool(*args: str, cwd: str | None = None) -> subprocess.CompletedProcess[str]:
    return run_zgtool(*args, cwd=cwd)


def test_help_lists_every_command_without_importing_torch():
    code = ("import sys; sys.argv = ['zgtool', '--help']\n"
            "from zgtool.app import main\n"
            "try:\n    main()\nexcept SystemExit:\n    pass\n"
            "print('TORCH' if 'torch' in sys.modules else 'NO-TORCH')")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60).stdout
    assert out.strip().endswith("NO-TORCH")
    for cmd in ("generate", "serve", "gateway", "probe", "latency-split", "bench", "gate", "dcgm", "defrag",
                "report", "verify", "client", "targets"):
        assert cmd in out


def test_version_prints_the_package_version():
    from zgtool import __version__

    proc = zgtool("--version")
    assert proc.returncode == 0 and proc.stdout.strip() == f"zgtool {__version__}"


def test_generate_json_has_ids_text_finish_reason_and_timings():
    proc = zgtool("generate", "--model", "null", "--prompt", "hi", "--max-tokens", "12", "--json")
    assert proc.returncode == 0, proc.stderr
    res = json.loads(proc.stdout)
    assert res["schema"] == "zgtool.result/1" and res["kind"] == "generate"
    d = res["data"]
    assert d["text"] == "Hello from t" and len(d["output_token_ids"]) == 12 and d["prompt_token_ids"]
    assert d["finish_reason"] == "length" and d["ttft_ms"] > 0 and d["total_ms"] >= d["ttft_ms"]


def test_generate_on_the_null_model_loads_no_torch_and_reports_no_compute_threads():
    code = ("import sys; sys.argv = ['zgtool', 'generate', '--model', 'null', '--prompt', 'hi', '--max-tokens', '4', "
            "'--json']\n"
            "from zgtool.app import main\n"
            "try:\n    main()\nexcept SystemExit as e:\n    assert not e.code, e.code\n"
            "print('TORCH' if 'torch' in sys.modules else 'NO-TORCH')")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    result, verdict = proc.stdout.strip().splitlines()
    assert verdict == "NO-TORCH"
    d = json.loads(result)["data"]
    assert d["num_threads"] is None and len(d["output_token_ids"]) == 4


def test_generate_streams_text_and_ends_with_a_timing_summary():
    proc = zgtool("generate", "--model", "dummy:tiny", "--prompt", "hi", "--max-tokens", "8", "--raw",
                  "--temperature", "0")
    assert proc.returncode == 0, proc.stderr
    assert "TTFT" in proc.stderr and "tok/s" in proc.stderr and "meaningless" in proc.stderr


def test_generate_is_deterministic_for_a_seed():
    args = ("generate", "--model", "dummy:tiny", "--max-tokens", "10", "--temperature", "0.8", "--seed", "3", "--json")
    a, b = (json.loads(zgtool(*args).stdout)["data"]["output_token_ids"] for _ in range(2))
    assert a == b


@pytest.mark.parametrize("args, needle", [
    (("generate", "--model", "nope/missing"), "unknown model"),
    (("generate", "--model", "null", "--max-tokens", "0"), "max_tokens"),
    (("generate", "--model", "dummy:huge"), "unknown dummy preset"),
], ids=["unknown-model", "max-tokens-zero", "unknown-preset"])
def test_bad_generate_input_is_one_line_and_exit_2(args, needle):
    proc = zgtool(*args)
    assert proc.returncode == 2
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and needle in lines[0] and "Traceback" not in proc.stderr


def test_targets_lists_builtins_and_config_targets_without_keys(tmp_path, monkeypatch):
    (tmp_path / "zgtool.toml").write_text(
        '[targets.vllm]\nurl = "http://10.0.0.9:8000"\napi = "openai"\nmodel = "m"\nkey_env = "VLLM_KEY"\n')
    proc = subprocess.run([sys.executable, "-m", "zgtool", "targets", "--json"], capture_output=True, text=True,
                          timeout=60, cwd=tmp_path, env={**__import__("os").environ, "VLLM_KEY": "sk-secret"})
    assert proc.returncode == 0, proc.stderr
    names = {t["name"]: t for t in json.loads(proc.stdout)}
    assert {"api", "local", "vllm"} <= set(names) and names["vllm"]["key_env"] == "VLLM_KEY"
    assert "sk-secret" not in proc.stdout


def test_a_malformed_config_is_exit_2_naming_the_file(tmp_path):
    (tmp_path / "zgtool.toml").write_text("[targets.x\nurl=")
    proc = zgtool("targets", cwd=str(tmp_path))
    assert proc.returncode == 2 and "zgtool.toml" in proc.stderr


def test_probe_with_a_url_first_probes_that_target_as_target_does():
    from zgtool.app import url_shorthand

    assert url_shorthand(["probe", "http://h:1", "-v"]) == ["probe", "--target", "http://h:1", "-v"]
    assert url_shorthand(["--debug", "probe", "https://h"]) == ["--debug", "probe", "--target", "https://h"]
    for kept in (["probe", "headers", "http://h:1"], ["latency-split", "http://h:1"], ["probe", "--target", "x"],
                 ["bench", "merge", "a.json", "b.json"], ["bench", "--direct", "http://h:1"]):
        assert url_shorthand(kept) == kept
    short, long = zgtool("probe", "http://127.0.0.1:9", "--timeout-s", "1"), \
        zgtool("probe", "--target", "http://127.0.0.1:9", "--timeout-s", "1")
    assert short.returncode == long.returncode == 3 and short.stderr == long.stderr
    assert "connection refused by 127.0.0.1:9" in short.stderr


def test_bench_with_urls_first_benches_them_as_direct_and_gateway():
    """`zgtool bench URL URL`, as latency-split takes its targets: click called the URL an unknown command."""
    from zgtool.app import url_shorthand

    assert url_shorthand(["bench", "http://e:8000", "http://g:4000", "--rate", "2"]) == \
        ["bench", "--direct", "http://e:8000", "--gateway", "http://g:4000", "--rate", "2"]
    assert url_shorthand(["bench", "http://e:8000", "--scenarios", "direct"]) == \
        ["bench", "--direct", "http://e:8000", "--scenarios", "direct"]
    short = zgtool("bench", "http://127.0.0.1:9", "--scenarios", "direct", "--duration", "1s", "--no-progress")
    long = zgtool("bench", "--direct", "http://127.0.0.1:9", "--scenarios", "direct", "--duration", "1s",
                  "--no-progress")
    assert short.returncode == long.returncode != 0 and short.stderr == long.stderr, short.stderr
    assert "No such command" not in short.stderr
    third = zgtool("bench", "http://127.0.0.1:9", "http://127.0.0.1:10", "http://127.0.0.1:11")
    assert third.returncode == 2 and third.stderr.count("\n") == 1 and "two URLs at most" in third.stderr, third.stderr

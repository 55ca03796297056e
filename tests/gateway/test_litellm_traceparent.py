"""LiteLLM and the client's W3C traceparent. LiteLLM 1.110 drops it unless its OpenTelemetry callback is loaded and
`forward_traceparent_to_llm_provider` is set; then the engine's spans carry the client's trace id and join each
request through the gateway (what times vLLM's streams through LiteLLM at any rate: its per-request metrics do not
pass a stream). `zgtool gateway --kind litellm --forward-traceparent` starts it so.

Live: zgtool's engine on the null model exporting its spans to latency-split's --otlp-listen, the real LiteLLM
(its own venv) told to forward in front of it: every request's trace context comes back on both paths, from the
engine's echo (which LiteLLM passes on as `llm_provider-x-zgtool-trace-id`: read before, it looked dropped) and from
its spans (the last ones arrive after the run: waited for, they looked dropped). The session's LiteLLM, as it
comes, drops it, and the note says what forwards it."""

from __future__ import annotations

import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from litellm_live import LITELLM_TIMEOUT_S

from zgtool.commands.latency import run
from zgtool.commands.latency_options import parse_split_options
from zgtool.errors import UsageError
from zgtool.gateway.catalog import LaunchRequest
from zgtool.gateway.litellm import render_config
from zgtool.gateway.supervisor import StackConfig

REQUESTS = 8


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _request(tmp_path: Path, forward: bool, spans_to: str | None = None) -> LaunchRequest:
    return LaunchRequest(path="litellm", host="127.0.0.1", port=1, upstream="http://127.0.0.1:2", run_dir=tmp_path,
                         model="m", forward_traceparent=forward, otlp_traces_endpoint=spans_to)


def _config(tmp_path: Path, forward: bool, spans_to: str | None = None) -> str:
    return render_config(_request(tmp_path, forward, spans_to), auth_module="zg_auth")


def test_exporting_its_own_spans_loads_the_callback_and_points_its_exporter_at_the_receiver(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import zgtool.gateway.litellm as litellm

    exporting = _config(tmp_path, False, "http://127.0.0.1:4318")
    assert '  callbacks: ["otel"]\n' in exporting and "forward_traceparent" not in exporting
    monkeypatch.setattr(litellm, "ensure_venv", lambda: tmp_path)
    monkeypatch.setattr(litellm, "upstream_models", lambda *a: ())
    env = litellm.launch(_request(tmp_path, True, "http://127.0.0.1:4318")).env
    assert env["OTEL_EXPORTER"] == "otlp_http" and env["OTEL_ENDPOINT"] == "http://127.0.0.1:4318/v1/traces"
    assert env["OTEL_SERVICE_NAME"] == "litellm" and "OTEL_TRACES_SAMPLER" not in env
    assert litellm.launch(_request(tmp_path, True)).env["OTEL_TRACES_SAMPLER"] == "always_off"
    assert litellm.spans_url("http://h:1/v1/traces/") == "http://h:1/v1/traces"
    with pytest.raises(UsageError, match="exports LiteLLM's own spans"):
        StackConfig(paths=("nginx",), upstream="http://127.0.0.1:9", otlp_traces_endpoint="http://127.0.0.1:4318")
    with pytest.raises(UsageError, match="malformed URL"):
        StackConfig(paths=("litellm",), upstream="http://127.0.0.1:9", otlp_traces_endpoint="127.0.0.1:4318")


def test_the_config_loads_the_otel_callback_and_forwards_only_when_asked(tmp_path: Path) -> None:
    told = _config(tmp_path, True)
    assert '  callbacks: ["otel"]\n  forward_traceparent_to_llm_provider: true\n' in told
    assert told.index("callbacks") > told.index("litellm_settings:") > told.index("model_list:")
    plain = _config(tmp_path, False)
    assert "otel" not in plain and "forward_traceparent" not in plain


def test_forwarding_is_litellms_alone_other_kinds_refuse_it_in_one_line(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="LiteLLM's"):
        StackConfig(paths=("nginx",), upstream="http://127.0.0.1:9", forward_traceparent=True)
    got = subprocess.run([sys.executable, "-m", "zgtool", "gateway", "--kind", "haproxy", "--upstream",
                          "http://127.0.0.1:9", "--forward-traceparent", "--run-dir", str(tmp_path)],
                         capture_output=True, text=True, timeout=60)
    assert got.returncode == 2, got.stderr
    (line,) = got.stderr.strip().splitlines()
    assert line.startswith("zgtool: --forward-traceparent is LiteLLM's"), line


@pytest.fixture(scope="module")
def forwarding_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str, int]]:
    """(engine URL, LiteLLM URL, the port the engine sends its spans to): the null engine exporting one span per
    request, and LiteLLM told to forward the traceparent in front of it."""
    yield from _stack(tmp_path_factory.mktemp("litellm-forward"), export_own_spans=False)


@pytest.fixture(scope="module")
def exporting_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str, int]]:
    """As forwarding_stack, with LiteLLM exporting its own spans to the same receiver."""
    yield from _stack(tmp_path_factory.mktemp("litellm-spans"), export_own_spans=True)


def _stack(run_dir: Path, *, export_own_spans: bool) -> Iterator[tuple[str, str, int]]:
    from zgtool.errors import MissingCapability, ZgError
    from zgtool.gateway.litellm import ensure_venv
    from zgtool.gateway.supervisor import LocalStack

    try:
        ensure_venv()
    except MissingCapability as exc:
        pytest.fail(f"the LiteLLM venv could not be created: {exc.message}")
    port = _free_port()
    cfg = StackConfig(model="null", paths=("litellm",), forward_traceparent=True,
                      otlp_traces_endpoint=f"http://127.0.0.1:{port}" if export_own_spans else None,
                      engine_args=("--otlp-endpoint", f"http://127.0.0.1:{port}"), run_dir=run_dir)
    try:
        with LocalStack(cfg) as st:
            yield st.urls["direct"], st.urls["litellm"], port
    except ZgError as exc:
        pytest.fail(f"the engine and LiteLLM did not start: {exc.message}")


@pytest.mark.timeout(LITELLM_TIMEOUT_S)
def test_litellms_own_spans_say_where_it_spent_each_request_and_leave_the_engines_verdict_alone(
        exporting_stack: tuple[str, str, int]) -> None:
    engine, litellm, otlp_port = exporting_stack
    data = _split([engine, litellm], stream=True, otlp_listen=str(otlp_port))
    direct, through = data["targets"]
    assert through["num_ok"] == REQUESTS, through["errors"]
    assert direct["hop_account"] is None
    acc = through["hop_account"]
    assert acc["requests"] == acc["of"] == acc["engine_spans"] == REQUESTS, acc
    for s in through["samples"]:
        parts = s["hop_spans"]
        assert set(parts) == {"before_call_ms", "call_ms", "after_call_ms"}, parts
        # its receipt to its call's end lies inside what the client measured (the server span may close after
        # the answer's last byte, with LiteLLM's logging: what comes after the call is not bounded so)
        assert parts["before_call_ms"] + parts["call_ms"] <= s["total_ms"] + 1.0
        assert parts["call_ms"] >= s["engine"]["total_ms"] - 1.0
    for t in (direct, through):
        assert t["trace_context"] == {"verdict": "survived", "came_back": REQUESTS, "sent": REQUESTS}, t["name"]
    assert any(n.startswith(f"{litellm}: the gateway's own account (LiteLLM OTLP spans, {REQUESTS} of {REQUESTS}")
               for n in data["attribution_notes"])


def _split(urls: list[str], **kw: Any) -> dict[str, Any]:
    return run(parse_split_options(urls, requests=REQUESTS, warmup=1, api="openai", model="null", max_tokens="4",
                                   as_json=True, quiet=True, **kw))["data"]


@pytest.mark.timeout(LITELLM_TIMEOUT_S)
def test_a_litellm_told_to_forward_passes_every_requests_trace_context_to_the_engine(
        forwarding_stack: tuple[str, str, int]) -> None:
    engine, litellm, otlp_port = forwarding_stack
    data = _split([engine, litellm], stream=True, otlp_listen=str(otlp_port))
    direct, through = data["targets"]
    assert through["num_ok"] == REQUESTS, through["errors"]
    for t in (direct, through):
        assert t["trace_context"] == {"verdict": "survived", "came_back": REQUESTS, "sent": REQUESTS}, t["name"]
        assert t["trace_echo"]["verdict"] == "survived" and t["trace_echo"]["survived"] == REQUESTS, t["trace_echo"]
    assert all(s["trace_echo"] == s["trace_id"] for s in through["samples"] if s["ok"])
    assert not any("forward_traceparent_to_llm_provider" in n for n in data["attribution_notes"])


@pytest.mark.timeout(LITELLM_TIMEOUT_S)
def test_litellm_as_it_comes_drops_the_trace_context_and_the_note_says_what_forwards_it(
        null_engine: str, litellm_before_null: Any) -> None:
    data = _split([null_engine, litellm_before_null.url], stream=False)
    direct, through = data["targets"]
    assert direct["trace_echo"]["verdict"] == "survived"
    assert through["trace_echo"]["verdict"] == "dropped" and through["trace_echo"]["dropped"] == REQUESTS
    (note,) = [n for n in data["attribution_notes"] if "through LiteLLM" in n]
    assert note.startswith(f"{litellm_before_null.url}: no request's trace context reached the engine")
    assert "forward_traceparent_to_llm_provider: true" in note and "--forward-traceparent" in note


def test_the_note_on_litellms_streams_before_vllm_names_the_forward_once() -> None:
    """The note on a LiteLLM stream path that lost vLLM's timing names the span route and what LiteLLM needs for
    it; when spans came but none for this path, the trace-context note below says it, and this one points there."""
    from zgtool.latency.analysis.phases import LITELLM_HOP, dropped_note
    from zgtool.latency.records import RequestSample

    samples = [RequestSample(index=i, worker=0, round=0, ok=True, total_ms=5.0, trace_id=f"{i:032x}",
                             hop_reports={LITELLM_HOP: 1.0}) for i in range(3)]
    alone = dropped_note("gw", samples, True, {"vLLM OTLP span"})
    assert "vLLM's OTLP spans" in alone and alone.endswith("--forward-traceparent` starts it so)")
    for s in samples:
        s.trace_back = False
    assert dropped_note("gw", samples, True, {"vLLM OTLP span"}).endswith(
        "once LiteLLM forwards the traceparent (the note below)")

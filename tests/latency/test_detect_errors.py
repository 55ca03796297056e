"""Errors a user can act on, fast: a server that is not an LLM API is named so in one line (exit 5), a
server that accepts and never answers stops the run at the first timeout, naming the step (exit 3),
and a target without a scheme gets "did you mean http://...?" (exit 2). Real local servers: Python's
own http.server, and a listening socket that never answers."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator

import pytest
from zgtest import run_zgtool, silent_listener, stop_process, wait_port

from zgtool.errors import ExitCode
from zgtool.http.net import free_port
from zgtool.latency.wire.detect import NotAnLlmApi, detect
from zgtool.targets import resolve


@pytest.fixture(scope="module")
def http_server() -> Iterator[str]:
    """`python3 -m http.server`: answers GET with 404 for /v1/models and POST with 501."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_port(port)
        yield f"http://127.0.0.1:{port}"
    finally:
        stop_process(proc)


@pytest.fixture
def silent() -> Iterator[str]:
    """A socket that accepts every connection and never sends a byte."""
    with silent_listener() as port:
        yield f"http://127.0.0.1:{port}"


def test_a_server_that_is_not_an_llm_api_is_not_detected_as_one(http_server: str) -> None:
    with pytest.raises(NotAnLlmApi) as info:
        detect(resolve(http_server), api_known=False, model_known=False, timeout_s=5)
    assert info.value.message == (f"{http_server} is not an OpenAI or Anthropic API: GET /v1/models 404, "
                                  "POST /v1/messages 501, POST /v1/chat/completions 501")


def test_latency_split_against_a_plain_web_server_says_so_in_one_line_and_exits_5(http_server: str) -> None:
    r = run_zgtool("latency-split", http_server, "-n", "3", timeout_s=60)
    assert r.returncode == ExitCode.UNRELIABLE, r.stdout + r.stderr
    assert r.stderr.count("\n") == 1 and "is not an OpenAI or Anthropic API" in r.stderr
    assert "detected" not in r.stderr and r.stdout == ""


def test_a_silent_server_stops_detection_at_its_first_timeout_naming_the_step(silent: str) -> None:
    r = run_zgtool("latency-split", silent, "--timeout-s", "1", "-n", "4", timeout_s=60)
    assert r.returncode == ExitCode.UNREACHABLE, r.stdout + r.stderr
    assert "no answer to GET /v1/models within 1 s (detecting the API)" in r.stderr
    assert r.stderr.count("\n") == 1


def test_a_silent_server_stops_the_warm_up_at_its_first_timeout(silent: str) -> None:
    r = run_zgtool("latency-split", silent, "--api", "anthropic", "--model", "m", "--timeout-s", "1", "-n", "4",
                   "--warmup", "3", timeout_s=60)
    assert r.returncode == ExitCode.UNREACHABLE, r.stdout + r.stderr
    assert "no answer to the warm-up request within 1 s" in r.stderr


@pytest.mark.parametrize("spec", ["127.0.0.1:18000", "localhost:8000", "example.com"])
def test_a_target_without_a_scheme_gets_a_suggestion(spec: str) -> None:
    r = run_zgtool("latency-split", spec, "-n", "1")
    assert r.returncode == ExitCode.USAGE
    assert f"did you mean http://{spec} ?" in r.stderr


@pytest.mark.parametrize("probe", [["probe", "headers"], ["probe", "stream"], ["probe", "--target"]],
                         ids=["headers", "stream", "all"])
def test_a_probe_of_a_plain_web_server_writes_what_it_found_and_exits_5(http_server: str, probe: list[str],
                                                                         tmp_path) -> None:  # noqa: ANN001
    out = tmp_path / "probe.json"
    r = run_zgtool(*probe, http_server, "-o", out, "--timeout-s", "5", timeout_s=90)
    assert r.returncode == ExitCode.UNRELIABLE, r.stdout + r.stderr
    assert "is not an OpenAI or Anthropic API" in r.stderr.splitlines()[-1]
    assert out.exists()

"""-H/--header: a key for a bare URL target (a LiteLLM proxy's master key, vLLM's --api-key) without a
zgtool.toml, on every command that sends requests to a target, and never written to a result.

Live against zgtool's engine started with a keys file (it answers 401 without a key, as a keyed LiteLLM
or vLLM does)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from engine_live import USER_KEY, in_process
from zgtest import run_zgtool

from zgtool.errors import ExitCode, UsageError
from zgtool.results import command_line
from zgtool.targets import KEY_HINT, Target, parse_headers, resolve

BEARER = f"Authorization: Bearer {USER_KEY}"


@pytest.fixture(scope="module")
def keyed_engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with in_process(tmp_path_factory.mktemp("keyed")) as live:
        yield live.url


def _no_key_in(path: Path) -> None:
    text = path.read_text()
    assert USER_KEY not in text, "the key's value reached the result"


# -- parsing and merging --------------------------------------------------------------------------------

def test_a_header_is_parsed_as_curl_writes_it_and_a_later_one_of_the_same_name_wins() -> None:
    assert parse_headers(["Authorization: Bearer a:b", "X-Team:infra", "authorization: Bearer c"]) == {
        "X-Team": "infra", "authorization": "Bearer c"}
    assert parse_headers(["X-Empty:"]) == {"X-Empty": ""}


@pytest.mark.parametrize(("spec", "words"), [
    ("Authorization Bearer x", "expected 'Name: value'"),
    (": x", "expected 'Name: value'"),
    ("Bad Name: x", "not a valid header name"),
    ("X-Key: a\r\nInjected: b", "line break"),
    ("Content-Length: 5", "sets this header itself"),
    ("host: other", "sets this header itself"),
])
def test_a_malformed_header_is_refused_without_repeating_its_value(spec: str, words: str) -> None:
    with pytest.raises(UsageError, match=words) as err:
        parse_headers([spec])
    assert "Bearer x" not in str(err.value) and "a\r\n" not in str(err.value)


def test_a_command_line_header_replaces_the_targets_own_and_its_key_in_any_case(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ZG_TEST_KEY", "from-env")
    t = Target("t", "http://127.0.0.1:1", "openai", key_env="ZG_TEST_KEY", headers={"X-Team": "a"})
    assert t.auth_headers() == {"X-Team": "a", "authorization": "Bearer from-env"}
    got = t.with_headers({"x-team": "b", "AUTHORIZATION": "Bearer cli"}).auth_headers()
    assert got == {"x-team": "b", "AUTHORIZATION": "Bearer cli"}
    anthropic = Target("t", "http://127.0.0.1:1", "anthropic", key_env="ZG_TEST_KEY")
    assert anthropic.with_headers({"X-API-KEY": "k"}).auth_headers() == {
        "X-API-KEY": "k", "anthropic-version": "2023-06-01"}
    t = resolve("http://127.0.0.1:9", headers={"X-A": "zz-secret"})
    assert t.auth_headers()["X-A"] == "zz-secret"
    assert "zz-secret" not in json.dumps(t.public()) and "X-A" in t.public()["header_names"]


@pytest.mark.parametrize(("argv", "recorded"), [
    (["latency-split", "U", "-H", "Authorization: Bearer s3cret"], "zgtool latency-split U -H Authorization: <redacted>"),
    (["probe", "U", "--header", "x-api-key: s3cret", "-o", "f"], "zgtool probe U --header x-api-key: <redacted> -o f"),
    (["bench", "--header=X-Key: s3cret"], "zgtool bench --header=X-Key: <redacted>"),
    (["client", "ask", "U", "-HX-Key: s3cret"], "zgtool client ask U -HX-Key: <redacted>"),
    (["latency-split", "U", "-H", "s3cret"], "zgtool latency-split U -H <redacted>"),
])
def test_a_result_records_the_command_line_with_header_values_cut(argv: list[str], recorded: str) -> None:
    assert command_line(argv) == recorded


# -- live: each command against an engine that wants a key ----------------------------------------------

def test_latency_split_without_a_key_says_how_to_send_one_and_with_h_measures(
        keyed_engine: str, tmp_path: Path) -> None:
    r = run_zgtool("latency-split", keyed_engine, "-n", "3", "--warmup", "0", "-q")
    assert r.returncode == 5, r.stderr
    assert "http_401" in r.stderr and KEY_HINT in r.stderr

    out = tmp_path / "split.json"
    r = run_zgtool("latency-split", keyed_engine, "-n", "3", "--warmup", "0", "-q", "-H", BEARER, "-o", out)
    assert r.returncode == 0, r.stderr
    data = json.loads(out.read_text())
    assert "Authorization: <redacted>" in data["command"]
    target = data["data"]["targets"][0]
    assert target["num_ok"] == 3 and target["num_error"] == 0
    _no_key_in(out)


def test_probe_headers_sends_the_header_and_writes_only_its_name(keyed_engine: str, tmp_path: Path) -> None:
    out = tmp_path / "probe.json"
    r = run_zgtool("probe", "headers", keyed_engine, "-H", f"x-api-key: {USER_KEY}", "--no-error-probe", "-o", out)
    assert r.returncode == 0, r.stderr
    data = json.loads(out.read_text())
    assert data["data"]["status"] == 200
    assert ["x-api-key", "<redacted>"] in data["data"]["request_headers"]
    _no_key_in(out)


def test_client_ask_with_h_is_answered_and_without_says_how_to_send_a_key(keyed_engine: str) -> None:
    r = run_zgtool("client", "ask", keyed_engine, "hi", "--max-tokens", "2", "-H", BEARER, "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["data"]["ok"] is True
    r = run_zgtool("client", "ask", keyed_engine, "hi", "--max-tokens", "2")
    assert r.returncode == 2 and "401" in r.stderr and KEY_HINT in r.stderr


def test_a_malformed_header_is_a_usage_error_before_anything_is_sent() -> None:
    r = run_zgtool("latency-split", "http://127.0.0.1:9", "-H", "no colon here")
    assert r.returncode == 2 and "expected 'Name: value'" in r.stderr
    r = run_zgtool("bench", "--start", "-H", "X-A: 1")
    assert r.returncode == 2 and "--start runs zgtool's own stack" in r.stderr


def test_bench_sends_the_header_to_k6_and_without_it_says_how_to_send_a_key(keyed_engine: str, tmp_path: Path) -> None:
    common = ("bench", "--direct", keyed_engine, "--scenarios", "direct", "--rate", "5", "--duration", "1s",
              "--rounds", "1", "--api", "anthropic", "--model", "null", "-q")
    out = tmp_path / "bench.json"
    r = run_zgtool(*common, "-H", BEARER, "--run-dir", tmp_path / "run", "-o", out)
    assert r.returncode == 0, r.stderr
    data = json.loads(out.read_text())
    assert data["data"]["requests"] >= 3 and data["data"]["failures"] == 0
    _no_key_in(out)
    r = run_zgtool(*common)
    assert r.returncode == ExitCode.UNRELIABLE, r.stderr     # every request failed
    assert "HTTP 401" in r.stderr and KEY_HINT in r.stderr

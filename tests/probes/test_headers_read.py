"""probe headers --read: recorded responses (HAR, curl -v, curl -sD-, raw header lines) analysed offline."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_probe_cli import zgtool

from zgtool.errors import UsageError
from zgtool.probes.headerfile import read_headers_file

REC = Path(__file__).parent / "recorded"


def ids(ds: list) -> set[str]:
    return {d.id for d in ds}


def test_a_har_file_shows_each_hosted_api_path() -> None:
    r = read_headers_file(REC / "hosted_apis.har")
    assert r.format == "har" and len(r.responses) == 2  # the blocked entry (status 0) is skipped and noted
    assert any("1 HAR entry without a response" in n for n in r.notes)
    anthropic, openai = r.responses
    assert anthropic.url == "https://api.anthropic.com/v1/messages" and anthropic.status == 200
    assert ids(anthropic.analysis.origin) == {"anthropic-api"}
    assert ids(anthropic.analysis.intermediaries) == {"cloudflare", "google-frontend"}
    assert anthropic.analysis.verdict == "identified" and anthropic.analysis.hop_estimate == 2
    assert not any(k.startswith(":") for k, _ in anthropic.headers)  # HTTP/2 pseudo-headers dropped
    assert ids(openai.analysis.origin) == {"openai-api"}
    assert {"cloudflare", "envoy"} <= ids(openai.analysis.intermediaries)
    envoy = next(d for d in openai.analysis.intermediaries if d.id == "envoy")
    assert any("x-envoy-upstream-service-time" in e.what for e in envoy.evidence)


def test_curl_verbose_output_is_read_with_its_request() -> None:
    r = read_headers_file(REC / "anthropic_curl_v.txt")
    assert r.format == "curl-v" and len(r.responses) == 1
    resp = r.responses[0]
    assert resp.status == 401 and resp.http_version == "2"
    assert resp.url == "api.anthropic.com/v1/messages" and resp.label.endswith("POST api.anthropic.com/v1/messages")
    assert "authentication_error" in resp.body_excerpt
    assert ids(resp.analysis.intermediaries) == {"cloudflare", "google-frontend"}


def test_curl_dump_header_output_with_several_responses_is_analysed_each() -> None:
    r = read_headers_file(REC / "engine_paths_curl_sD.txt")
    assert r.format == "http" and [x.status for x in r.responses] == [100, 200, 200]
    _, via_nginx, via_caddy_like = r.responses
    assert ids(via_nginx.analysis.intermediaries) == {"nginx"} and ids(via_nginx.analysis.origin) == {"zgtool-engine"}
    assert via_nginx.body_excerpt == "{}"
    # no proxy header, but the engine's lower-case names arrive re-cased: a hop re-serialised them
    assert via_caddy_like.analysis.intermediaries[0].id == "unidentified"
    assert via_caddy_like.analysis.verdict == "likely"
    assert "re-cased" in via_caddy_like.analysis.hop_evidence[0]


@pytest.mark.parametrize(("name", "verdict", "inter"), [
    ("squid_raw_headers.txt", "identified", {"squid"}),
    ("recased_raw_headers.txt", "likely", {"unidentified"}),
])
def test_raw_header_lines_without_a_status_line(name: str, verdict: str, inter: set[str]) -> None:
    r = read_headers_file(REC / name)
    (resp,) = r.responses
    assert resp.status is None and ids(resp.analysis.origin) == {"zgtool-engine"}
    assert resp.analysis.verdict == verdict and ids(resp.analysis.intermediaries) == inter


@pytest.mark.parametrize(("content", "message"), [
    ("", "is empty"),
    ("{not json", "is not valid JSON"),
    ('{"log": {"pages": []}}', "is JSON but not a HAR file"),
    ("hello\nthis is not a capture of headers\n", "no HTTP response headers found"),
])
def test_bad_files_are_one_line_usage_errors(tmp_path: Path, content: str, message: str) -> None:
    bad = tmp_path / "bad.txt"
    bad.write_text(content)
    with pytest.raises(UsageError, match=message):
        read_headers_file(bad)
    r = zgtool("probe", "headers", "--read", str(bad))
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and message in r.stderr


def test_the_cli_reads_a_har_file_into_a_versioned_result() -> None:
    r = zgtool("probe", "headers", "--read", str(REC / "hosted_apis.har"), "--json")
    assert r.returncode == 0, r.stderr
    res = json.loads(r.stdout)
    assert res["schema"] == "zgtool.result/1" and res["data"]["mode"] == "read"
    assert [x["analysis"]["verdict"] for x in res["data"]["responses"]] == ["identified", "identified"]
    human = zgtool("probe", "headers", "--read", str(REC / "hosted_apis.har"))
    assert human.returncode == 0 and "Cloudflare" in human.stdout and "entry 1: POST" in human.stdout


def test_read_and_a_target_together_is_a_usage_error() -> None:
    r = zgtool("probe", "headers", "http://127.0.0.1:9", "--read", str(REC / "hosted_apis.har"))
    assert r.returncode == 2 and "do not also give a TARGET" in r.stderr
    missing = zgtool("probe", "headers", "--read", "/nonexistent/file.har")
    assert missing.returncode == 2 and "not found" in missing.stderr

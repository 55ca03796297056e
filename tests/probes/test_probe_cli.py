"""`zgtool probe ...` end to end through the CLI: exit codes, one-line errors, versioned results."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from probe_servers import NotHTTPServer, ThreadedUvicorn, free_port

# zgtool.app.main registers every command and maps errors to exit codes (the console script's job)
ENTRY = "import sys; sys.argv[0] = 'zgtool'; from zgtool.app import main; main()"


def zgtool(*args: str, prefix: tuple[str, ...] = (), cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "NO_COLOR": "1", "COLUMNS": "200"}
    env.pop("ZGTOOL_DEBUG", None)
    return subprocess.run([*prefix, sys.executable, "-c", ENTRY, *args], capture_output=True, text=True,
                          timeout=60, env=env, cwd=cwd)


def test_unknown_target_exits_2_listing_known_names(tmp_path: Path) -> None:
    r = zgtool("probe", "headers", "nosuch", cwd=tmp_path)
    assert r.returncode == 2
    assert r.stderr.strip() == "zgtool: unknown target 'nosuch'; known targets: api, local (or pass a URL)"


def test_malformed_url_exits_2() -> None:
    r = zgtool("probe", "headers", "http://[::1")
    assert r.returncode == 2 and "malformed URL" in r.stderr and "Traceback" not in r.stderr


def test_refused_port_exits_3_in_one_line() -> None:
    r = zgtool("probe", "stream", f"http://127.0.0.1:{free_port()}")
    assert r.returncode == 3
    assert len(r.stderr.strip().splitlines()) == 1 and "connection refused" in r.stderr


def test_a_port_that_does_not_speak_http_exits_3(not_http: NotHTTPServer) -> None:
    r = zgtool("probe", "headers", f"http://127.0.0.1:{not_http.port}", "--timeout", "3")
    assert r.returncode == 3 and "does not speak HTTP" in r.stderr


def test_a_corrupt_capture_exits_2_with_a_clear_message(tmp_path: Path) -> None:
    bad = tmp_path / "x.pcap"
    bad.write_bytes(b"this is not a capture at all")
    r = zgtool("probe", "tcp", "--read", str(bad))
    assert r.returncode == 2 and "is not a pcap or pcapng capture" in r.stderr


def test_no_probe_and_no_target_exits_2() -> None:
    r = zgtool("probe")
    assert r.returncode == 2 and "--target" in r.stderr


def test_headers_json_is_a_versioned_result_without_the_key(origin: ThreadedUvicorn, tmp_path: Path) -> None:
    (tmp_path / "zgtool.toml").write_text(
        f'[targets.fake]\nurl = "{origin.url}"\nkey_env = "ZG_FAKE_KEY"\n')
    os.environ["ZG_FAKE_KEY"] = "sk-never-printed"
    try:
        r = zgtool("probe", "headers", "fake", "--json", cwd=tmp_path)
    finally:
        del os.environ["ZG_FAKE_KEY"]
    assert r.returncode == 0, r.stderr
    res = json.loads(r.stdout)
    assert res["schema"] == "zgtool.result/1" and res["kind"] == "probe.headers"
    assert res["target"]["name"] == "fake" and res["target"]["key_env"] == "ZG_FAKE_KEY"
    assert {d["id"] for d in res["data"]["analysis"]["origin"]} >= {"zgtool-engine"}
    assert "sk-never-printed" not in r.stdout


def test_stream_writes_the_result_file_and_renders_the_verdict(origin: ThreadedUvicorn, tmp_path: Path) -> None:
    out = tmp_path / "stream.json"
    r = zgtool("probe", "stream", origin.url, "-o", str(out))
    assert r.returncode == 0, r.stderr
    assert "streaming" in r.stdout and "verdict" in r.stdout
    res = json.loads(out.read_text())
    assert res["kind"] == "probe.stream" and res["data"]["buffering"]["verdict"] == "streaming"


@pytest.mark.parametrize("probe", ["headers", "stream"])
def test_a_target_given_with_its_v1_prints_the_path_it_asked_once(origin: ThreadedUvicorn, probe: str) -> None:
    # the README's form (https://gateway.example/v1): the request goes to /v1/..., and so must the printed URL
    r = zgtool("probe", probe, origin.url + "/v1")
    assert r.returncode == 0, r.stderr
    assert "/v1/v1/" not in r.stdout
    assert f"{origin.url}/v1/messages" in r.stdout or f"{origin.url}/v1/chat/completions" in r.stdout


def test_probe_target_runs_all_four_into_one_result(origin: ThreadedUvicorn, tmp_path: Path) -> None:
    (tmp_path / "zgtool.toml").write_text(f'[targets.fake]\nurl = "{origin.url}"\n')
    r = zgtool("probe", "--target", "fake", "--json", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    res = json.loads(r.stdout)
    d = res["data"]
    assert res["kind"] == "probe.all" and d["errors"] == {}
    assert d["skipped"] == {"tls": "plain http target: no TLS to probe"}
    assert d["tcp"]["mode"] == "live" and d["headers"]["status"] == 200
    assert d["stream"]["buffering"]["verdict"] == "streaming"
    assert d["summary"]["hop_estimate"] == 0 and "zgtool engine" in d["summary"]["origin"]


def test_probe_target_prints_a_one_screen_summary_and_the_tables_with_verbose(origin: ThreadedUvicorn,
                                                                              tmp_path: Path) -> None:
    (tmp_path / "zgtool.toml").write_text(f'[targets.fake]\nurl = "{origin.url}"\n')
    r = zgtool("probe", "--target", "fake", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert len(lines) <= 30, r.stdout
    text = " ".join(r.stdout.split())
    assert "origin zgtool engine" in text and "hops 0" in text and "fidelity streaming" in text
    assert "hop_estimate" not in r.stdout and "captured True" not in r.stdout     # words, not field names
    verbose = zgtool("probe", "--target", "fake", "--verbose", cwd=tmp_path)
    assert verbose.returncode == 0 and len(verbose.stdout.splitlines()) > len(lines)


@pytest.mark.skipif(shutil.which("setpriv") is None or os.geteuid() != 0, reason="needs root and setpriv to drop CAP_NET_RAW")
def test_without_capture_privilege_tcp_falls_back_and_require_capture_exits_4(origin: ThreadedUvicorn) -> None:
    drop = ("setpriv", "--inh-caps=-net_raw,-net_admin", "--bounding-set=-net_raw,-net_admin")
    r = zgtool("probe", "tcp", origin.url, "--json", prefix=drop)
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)["data"]
    assert data["captured"] is False and "CAP_NET_RAW" in data["capture_note"]
    assert data["connect_ms"] > 0 and data["tcp_info_rtt_ms"] is not None and data["stream"] is None
    r4 = zgtool("probe", "tcp", origin.url, "--require-capture", prefix=drop)
    assert r4.returncode == 4 and "CAP_NET_RAW" in r4.stderr

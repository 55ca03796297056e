"""The gateways people run (HAProxy, Caddy, Varnish, Squid from Debian; the LiteLLM proxy in its
own venv) started for real by zgtool in front of the real engine (`--model null`), through
`zgtool.gateway.kinds.start_gateway`: the official SDKs work through each, errors keep their
status, streaming configs pass SSE events through and buffered ones hold them, stopping
(and a failed start, and Ctrl-C) leaves no process, a missing binary is one line and exit 4.

A missing Debian package is a failure (scripts/setup.sh installs them), not a skip; so is a
LiteLLM venv that cannot be created (it needs PyPI once; later runs reuse the cache)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import warnings
from collections.abc import Iterator
from pathlib import Path

import anthropic
import httpx
import openai
import pytest
from gw_fake_upstream import FakeUpstream

from zgtool.errors import MissingCapability
from zgtool.gateway.kinds import GATEWAY_KINDS, Gateway, start_gateway
from zgtool.gateway.procs import free_port
from zgtool.gateway.supervisor import StartFailed

ZGTOOL = [sys.executable, "-m", "zgtool"]
PROXIES = ["haproxy", "caddy", "varnish", "squid"]
BUFFERED = ["haproxy", "caddy", "varnish"]
MSGS = [{"role": "user", "content": "hello"}]


@pytest.fixture(scope="module")
def engine(null_engine: str) -> str:
    return null_engine      # the session's (tests/conftest.py), with the one LiteLLM in front of it


# creating the LiteLLM venv (first run on a machine; scripts/setup.sh does it before the suite)
# takes minutes: the tests that may be first to need it get a longer limit
LITELLM_TIMEOUT_S = 900


@pytest.fixture(scope="session")
def litellm_venv() -> Path:
    """Created once per machine (minutes, needs PyPI); a failure names why, never a silent skip."""
    from zgtool.gateway.litellm import ensure_venv

    try:
        return ensure_venv()
    except MissingCapability as exc:
        pytest.fail(f"the LiteLLM venv could not be created: {exc.message}")


def _procs_mentioning(text: str) -> list[int]:
    """Live processes whose command line contains text (a run folder path is unique to a test)."""
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            cmd = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            state = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if text in cmd and state != "Z":
            out.append(int(entry))
    return out


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _wait_gone(pids: list[int], timeout_s: float = 15.0) -> list[int]:
    deadline = time.monotonic() + timeout_s
    while (left := [p for p in pids if _alive(p)]) and time.monotonic() < deadline:
        time.sleep(0.05)
    return left


def _sdk_round_trip(url: str, api_key: str = "sk-test") -> tuple[str, str]:
    client = openai.OpenAI(base_url=url + "/v1", api_key=api_key, max_retries=0)
    whole = client.chat.completions.create(model="null", max_tokens=8, messages=MSGS)
    chunks = list(client.chat.completions.create(model="null", max_tokens=8, messages=MSGS, stream=True))
    streamed = "".join((c.choices[0].delta.content or "") for c in chunks if c.choices)
    return whole.choices[0].message.content or "", streamed


def test_every_stream_through_caddy_arrives_whole(engine: str, tmp_path: Path) -> None:
    """Debian's Caddy 2.6 cut about 1 in 100 streamed POST answers after their first event (caddy.log: "reading
    from backend ... use of closed network connection", "aborting with incomplete response"; caddyserver/caddy
    #5431): Go's HTTP/1 server closes the client's request body at the answer's first write, while the upstream
    transport may still be reading it, and the transport then drops the upstream connection. The streaming
    config buffers the request body first (buffer_requests), so nothing is left to read."""
    body = {"model": "null", "max_tokens": 8, "stream": True, "messages": MSGS}

    def content(client: httpx.Client, url: str) -> str:
        text = client.post(url + "/v1/chat/completions", json=body).text
        return "".join(openai.types.chat.ChatCompletionChunk.model_validate_json(line[6:]).choices[0].delta.content
                       or "" for line in text.splitlines()
                       if line.startswith("data: {") and '"choices":[{' in line)

    with httpx.Client() as client:
        whole = content(client, engine)
        assert len(whole) == 8
        with start_gateway("caddy", engine, tmp_path) as gw:
            cut = [got for _ in range(400) if (got := content(client, gw.url)) != whole]
    assert cut == []


@pytest.mark.parametrize("kind", PROXIES)
def test_openai_sdk_through_each_proxy_gets_the_engines_answer_streaming_included(
        engine: str, kind: str, tmp_path: Path) -> None:
    direct = _sdk_round_trip(engine)
    with start_gateway(kind, engine, tmp_path) as gw:
        assert gw.url != engine and gw.pids
        assert _sdk_round_trip(gw.url) == direct
        assert (tmp_path / f"{kind}.log").exists()


@pytest.mark.parametrize("kind", PROXIES)
def test_engine_errors_keep_their_status_and_body_through_each_proxy(engine: str, kind: str, tmp_path: Path) -> None:
    bad = {"model": "null", "max_tokens": 0, "messages": MSGS}
    want = httpx.post(engine + "/v1/chat/completions", json=bad)
    assert want.status_code == 400
    with start_gateway(kind, engine, tmp_path) as gw:
        got = httpx.post(gw.url + "/v1/chat/completions", json=bad)
        assert got.status_code == 400 and got.json()["error"]["type"] == want.json()["error"]["type"]
        assert httpx.get(gw.url + "/no/such/route").status_code == 404
        with pytest.raises(openai.BadRequestError):
            openai.OpenAI(base_url=gw.url + "/v1", api_key="k", max_retries=0).chat.completions.create(
                model="null", max_tokens=0, messages=MSGS)


def _delta_times(url: str) -> tuple[list[float], bytes]:
    """When each content_block_delta reached the client, and the whole body."""
    body = {"model": "null", "max_tokens": 8, "stream": True, "messages": MSGS}
    times: list[float] = []
    data = b""
    with httpx.Client() as c, c.stream("POST", url + "/v1/messages", json=body) as r:
        assert r.status_code == 200, r.read()
        for chunk in r.iter_bytes():
            times += [time.perf_counter()] * chunk.count(b"event: content_block_delta")
            data += chunk
    return times, data


def _delta_spread_s(url: str, gw: Gateway | None = None) -> float:
    """Seconds between the first and the last content_block_delta reaching the client.

    Through a gateway, a stream cut short (no message_stop: CI saw once, through Caddy, a 200
    with no delta at all, and its logs were gone with the run) is tried once more, and what
    it carried and the gateway's logs are printed as a warning; a second short stream fails."""
    times, data = _delta_times(url)
    if gw is not None and b"event: message_stop" not in data:
        logs = {name: path.read_text(errors="replace")[-2000:] for name, path in gw.logs().items() if path.exists()}
        warnings.warn(f"{gw.path}: a stream cut short ({len(times)} deltas): {data[-1500:]!r}; logs: {logs}",
                      stacklevel=2)
        times, data = _delta_times(url)
    assert len(times) == 8 and b"event: message_stop" in data, data
    return times[-1] - times[0]


@pytest.fixture(scope="module")
def paced() -> Iterator[FakeUpstream]:
    """An upstream that paces 8 SSE events 30 ms apart (the null engine sends them at once)."""
    up = FakeUpstream().start()
    yield up
    up.stop()


@pytest.mark.parametrize("kind", PROXIES)
def test_streaming_configs_pass_each_sse_event_through(paced: FakeUpstream, kind: str, tmp_path: Path) -> None:
    direct = _delta_spread_s(paced.url)
    with start_gateway(kind, paced.url, tmp_path) as gw:
        assert _delta_spread_s(gw.url, gw) > 0.6 * direct


@pytest.mark.parametrize("kind", BUFFERED)
def test_buffered_configs_hold_the_stream_until_it_ends(paced: FakeUpstream, kind: str, tmp_path: Path) -> None:
    direct = _delta_spread_s(paced.url)
    with start_gateway(kind, paced.url, tmp_path, buffering="buffered") as gw:
        assert gw.path == f"{kind}-buffered"
        assert _delta_spread_s(gw.url, gw) < 0.2 * direct


def test_haproxy_as_shipped_coalesces_sse_events(paced: FakeUpstream, tmp_path: Path) -> None:
    # without option http-no-delay, partial bodies leave with MSG_MORE: the kernel holds the
    # small events back (up to ~200 ms) and hands several over at once
    direct = _delta_spread_s(paced.url)
    with start_gateway("haproxy", paced.url, tmp_path, buffering="default") as gw:
        assert gw.path == "haproxy-default"
        assert _delta_spread_s(gw.url, gw) < 0.5 * direct


@pytest.mark.parametrize("kind", PROXIES)
def test_stop_leaves_no_process(engine: str, kind: str, tmp_path: Path) -> None:
    gw = start_gateway(kind, engine, tmp_path)
    pids = list(gw.pids)
    mentioning = _procs_mentioning(str(tmp_path))
    assert pids and set(pids) <= set(mentioning)
    gw.stop()
    assert _wait_gone(mentioning) == []
    assert _procs_mentioning(str(tmp_path)) == []
    gw.stop()  # idempotent


@pytest.mark.parametrize("kind", PROXIES)
def test_a_failed_start_names_the_log_and_leaves_no_process(engine: str, kind: str, tmp_path: Path) -> None:
    # an address this host lacks (TEST-NET-1), so the gateway's own bind fails (a port another process holds is
    # refused before anything starts: tests/gateway/test_taken_port.py)
    with pytest.raises(StartFailed) as err:
        start_gateway(kind, engine, tmp_path / "second", port=8080, host="192.0.2.1", start_timeout_s=30)
    assert f"{kind} failed to start" in err.value.message and f"{kind}.log" in err.value.message
    assert _wait_gone(_procs_mentioning(str(tmp_path / "second"))) == []


@pytest.mark.parametrize("kind", PROXIES)
def test_a_missing_binary_is_one_line_with_the_install_command(
        engine: str, kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(Path(sys.executable).parent))
    monkeypatch.setenv("ZGTOOL_SBIN_DIRS", "")
    with pytest.raises(MissingCapability) as err:
        start_gateway(kind, engine, tmp_path)
    assert f"apt-get install -y {kind}" in err.value.message and "\n" not in err.value.message


def test_zgtool_gateway_without_the_binary_exits_4_with_one_line(tmp_path: Path) -> None:
    env = {**os.environ, "PATH": str(Path(sys.executable).parent), "ZGTOOL_SBIN_DIRS": ""}
    p = subprocess.run([*ZGTOOL, "gateway", "--kind", "caddy", "--upstream", "http://127.0.0.1:9"],
                       capture_output=True, text=True, timeout=60, env=env, cwd=tmp_path)
    assert p.returncode == 4, p.stderr
    assert p.stderr.strip().count("\n") == 0 and "apt-get install -y caddy" in p.stderr
    assert "Traceback" not in p.stderr


def test_ctrl_c_on_zgtool_gateway_stops_the_gateway(engine: str, tmp_path: Path) -> None:
    port = free_port()
    run = tmp_path / "run"
    proc = subprocess.Popen([*ZGTOOL, "gateway", "--kind", "haproxy", "--upstream", engine, "--port", str(port),
                             "--run-dir", str(run)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "haproxy did not come up"
            time.sleep(0.1)
        gw_pids = _procs_mentioning(str(run))
        assert gw_pids
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=30) in (0, 130)  # 130 when it lands before the endpoint table
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert _wait_gone(gw_pids) == []
    assert (run / "haproxy.cfg").exists() and (run / "haproxy.log").exists()


def test_every_kind_is_reachable_through_start_gateway(engine: str, tmp_path: Path) -> None:
    assert set(PROXIES) | {"litellm", "nginx", "pygw", "stack"} == set(GATEWAY_KINDS)
    with start_gateway("nginx", engine, tmp_path / "n", buffering="buffered") as gw:
        assert gw.path == "nginx-buffered" and httpx.get(gw.url + "/health").status_code == 200
    with start_gateway("pygw", engine, tmp_path / "p") as gw:
        assert httpx.get(gw.url + "/health").status_code == 200


# ---- LiteLLM proxy ---------------------------------------------------------------------------

@pytest.fixture(scope="module")
def litellm_gw(litellm_before_null: Gateway) -> Gateway:
    return litellm_before_null     # the session's, in front of its null engine (tests/conftest.py)


@pytest.mark.timeout(LITELLM_TIMEOUT_S)
def test_openai_sdk_through_litellm_gets_the_engines_answer_streaming_included(
        engine: str, litellm_gw: Gateway) -> None:
    assert _sdk_round_trip(litellm_gw.url) == _sdk_round_trip(engine)
    r = httpx.post(litellm_gw.url + "/v1/chat/completions", json={"model": "null", "max_tokens": 2, "messages": MSGS},
                   headers={"authorization": "Bearer anything"})
    assert r.status_code == 200
    assert float(r.headers["x-litellm-overhead-duration-ms"]) >= 0
    assert "zgtool-engine" in r.headers["llm_provider-server"]  # the engine's headers, prefixed


@pytest.mark.timeout(LITELLM_TIMEOUT_S)
def test_anthropic_sdk_through_litellm_is_translated_to_the_engines_openai_api(
        engine: str, litellm_gw: Gateway) -> None:
    client = anthropic.Anthropic(base_url=litellm_gw.url, api_key="sk-any", max_retries=0)
    whole = client.messages.create(model="null", max_tokens=8, messages=MSGS)
    with client.messages.stream(model="null", max_tokens=8, messages=MSGS) as s:
        streamed = "".join(s.text_stream)
    direct = openai.OpenAI(base_url=engine + "/v1", api_key="k").chat.completions.create(
        model="null", max_tokens=8, messages=MSGS)
    assert whole.content[0].text == streamed == direct.choices[0].message.content


@pytest.mark.timeout(LITELLM_TIMEOUT_S)
def test_litellm_passes_engine_errors_as_errors(litellm_gw: Gateway) -> None:
    r = httpx.post(litellm_gw.url + "/v1/chat/completions", json={"model": "null", "max_tokens": 0, "messages": MSGS})
    assert 400 <= r.status_code < 500, r.text


@pytest.mark.timeout(LITELLM_TIMEOUT_S)
def test_litellm_with_a_keys_file_accepts_only_its_keys_and_applies_their_rpm(
        engine: str, litellm_venv: Path, tmp_path: Path) -> None:
    keys = tmp_path / "keys.toml"
    keys.write_text('[keys.sk-team-a]\nname = "team-a"\nrpm = 2\nburst = 2\n\n[keys.sk-batch]\nname = "batch"\nrpm = 600\n')
    body = {"model": "null", "max_tokens": 2, "messages": MSGS}
    with start_gateway("litellm", engine, tmp_path / "run", keys_file=keys) as gw:
        def post(key: str) -> httpx.Response:
            return httpx.post(gw.url + "/v1/chat/completions", json=body, headers={"authorization": f"Bearer {key}"})

        assert post("sk-wrong").status_code == 401
        assert post("sk-batch").status_code == 200
        statuses = [post("sk-team-a").status_code for _ in range(4)]
        assert statuses[:2] == [200, 200] and 429 in statuses[2:], statuses
        assert (tmp_path / "run" / "litellm-master-key").stat().st_mode & 0o077 == 0
        assert "sk-team-a" not in (tmp_path / "run" / "zg_litellm_auth.py").read_text()  # digests only


@pytest.mark.timeout(LITELLM_TIMEOUT_S)
def test_litellm_with_redis_caches_answers_in_redis(
        engine: str, litellm_venv: Path, redis_url: str, tmp_path: Path) -> None:
    import redis

    body = {"model": "null", "max_tokens": 4, "temperature": 0, "messages": [{"role": "user", "content": "cache me"}]}
    with start_gateway("litellm", engine, tmp_path / "run", redis_url=redis_url) as gw:
        config = (tmp_path / "run" / "litellm.yaml").read_text()
        assert "redis" in config
        # no model given: a route for each model the engine lists, then the wildcard; LiteLLM lists them first
        served = [m["id"] for m in httpx.get(engine + "/v1/models").json()["data"]]
        assert [ln.split(":", 1)[1].strip().strip('"') for ln in config.splitlines() if "- model_name:" in ln] == [
            *served, "*"]
        assert [m["id"] for m in httpx.get(gw.url + "/v1/models").json()["data"][:len(served)]] == served
        first = httpx.post(gw.url + "/v1/chat/completions", json=body)
        assert first.status_code == 200
        deadline = time.monotonic() + 20
        while True:  # the answer is written to Redis after it is sent: poll for the hit
            again = httpx.post(gw.url + "/v1/chat/completions", json=body)
            assert again.status_code == 200
            if "x-litellm-cache-key" in again.headers:
                break
            assert time.monotonic() < deadline, dict(again.headers)
            time.sleep(0.2)
        assert again.json()["choices"][0]["message"] == first.json()["choices"][0]["message"]
        assert redis.Redis.from_url(redis_url).dbsize() > 0


def test_litellm_without_pypi_is_one_line_naming_the_network_need_and_exit_4(tmp_path: Path) -> None:
    # a fresh cache dir and a pip that may reach no index: the venv cannot be created
    env = {**os.environ, "ZGTOOL_CACHE_DIR": str(tmp_path / "cache"), "PIP_NO_INDEX": "1",
           "PIP_FIND_LINKS": str(tmp_path), "PIP_CONFIG_FILE": os.devnull}
    p = subprocess.run([*ZGTOOL, "gateway", "--kind", "litellm", "--upstream", "http://127.0.0.1:9",
                        "--run-dir", str(tmp_path / "run")], capture_output=True, text=True, timeout=240, env=env)
    assert p.returncode == 4, p.stderr
    last = p.stderr.strip().splitlines()[-1]
    assert last.startswith("zgtool: ") and "needs network access to PyPI" in last and "Traceback" not in p.stderr
    assert not (tmp_path / "cache" / "venvs" / "litellm" / ".zgtool-ok").exists()

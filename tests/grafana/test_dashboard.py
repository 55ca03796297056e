"""The shipped Grafana dashboard reads metrics that exist: every PromQL query names a metric the
engine's /metrics, pygw's /metrics or dcgm-exporter (recorded pages) exposes, and every engine and
pygw query returns data from a real Prometheus scraping a live engine and a live pygw in front of it."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from zgtest import poll, run_zgtool, wait_until

from zgtool.grafana.dashboard import dashboard, queries
from zgtool.http.net import free_port

PROMETHEUS = shutil.which("prometheus")
DCGM_DATA = Path(__file__).resolve().parents[1] / "dcgm" / "data"
NAME = re.compile(r"\b(zg_[a-z0-9_]+|pygw_[a-z0-9_]+|DCGM_FI_[A-Z0-9_]+)\b")
LIVE = ("engine", "pygw")   # the sources a live process answers for here (dcgm: recorded pages)


def _names(expr: str) -> set[str]:
    return set(NAME.findall(expr))


def _exposed(text: str) -> set[str]:
    return {ln.split("{")[0].split(" ")[0] for ln in text.splitlines() if ln and not ln.startswith("#")}


@pytest.fixture(scope="module")
def engine() -> Iterator[str]:
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "zgtool", "serve", "--model", "null", "--port", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"

    def up() -> bool:
        try:
            return httpx.get(url + "/health", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    try:
        wait_until(lambda: up() or proc.poll() is not None, 60, "the engine")
        assert proc.poll() is None
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=20)


@pytest.fixture(scope="module")
def pygw(engine: str) -> Iterator[str]:
    """pygw (open policy) in front of the live engine: its /metrics is the gateway hop's."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "zgtool.gateway.pygw_main", "--upstream", engine, "--port", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"

    def up() -> bool:
        try:
            return httpx.get(url + "/health", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    try:
        wait_until(lambda: up() or proc.poll() is not None, 60, "pygw")
        assert proc.poll() is None
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=20)


def _traffic(url: str, n: int = 6) -> None:
    body = {"model": "null", "max_tokens": 8, "messages": [{"role": "user", "content": "a shared prompt prefix " * 8}]}
    for _ in range(n):
        httpx.post(url + "/v1/messages", json=body, timeout=10,
                   headers={"anthropic-version": "2023-06-01", "x-api-key": "sk-test"})
    httpx.post(url + "/v1/messages", json={"model": "null"}, timeout=10)   # a 400: the error series exists


def test_the_export_is_grafana_json_with_every_panel_and_the_model_variable(tmp_path: Path):
    out = tmp_path / "d.json"
    proc = run_zgtool("grafana", "export", "-o", out)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(out.read_text())
    assert doc == dashboard() and doc["schemaVersion"] >= 36
    assert [v["name"] for v in doc["templating"]["list"]] == ["datasource", "model"]
    assert all(t["expr"] for p in doc["panels"] for t in p["targets"])


def test_every_query_names_a_metric_the_engine_pygw_or_dcgm_exporter_exposes(engine: str, pygw: str):
    _traffic(engine)
    _traffic(pygw)
    live = {"engine": _exposed(httpx.get(engine + "/metrics", timeout=5).text),
            "pygw": _exposed(httpx.get(pygw + "/metrics", timeout=5).text)}
    recorded: set[str] = set()
    for f in DCGM_DATA.glob("exporter_*.txt"):
        recorded |= _exposed(f.read_text())
    for source, expr in queries():
        names = _names(expr)
        assert names, expr
        have = live[source] if source in LIVE else recorded
        assert names <= have, (expr, sorted(names - have))


@pytest.mark.skipif(PROMETHEUS is None, reason="prometheus binary not installed (Debian package 'prometheus')")
def test_every_engine_and_pygw_query_returns_data_from_a_real_prometheus(engine: str, pygw: str, tmp_path: Path):
    port = free_port()
    cfg = tmp_path / "prometheus.yml"
    cfg.write_text("global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nscrape_configs:\n"
                   "  - job_name: zgtool\n    static_configs:\n"
                   f"      - targets: ['{engine.split('://', 1)[1]}', '{pygw.split('://', 1)[1]}']\n")
    prom = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen([PROMETHEUS, f"--config.file={cfg}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                             f"--web.listen-address=127.0.0.1:{port}"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    exprs = [e.replace("$__rate_interval", "30s").replace("$model", ".*") for s, e in queries() if s in LIVE]
    assert any(s == "pygw" for s, _ in queries())
    missing: list[str] = list(exprs)

    def all_answer() -> bool:
        _traffic(engine, 2)   # keep the counters moving between scrapes
        _traffic(pygw, 2)
        still = []
        for e in missing:
            try:
                r = httpx.get(prom + "/api/v1/query", params={"query": e}, timeout=5)
                ok = r.status_code == 200 and r.json()["data"]["result"]
            except httpx.HTTPError:
                ok = False
            if not ok:
                still.append(e)
        missing[:] = still
        return not still

    try:
        assert poll(all_answer, 90, interval_s=1.0), f"queries without data: {missing}"
    finally:
        proc.terminate()
        proc.wait(timeout=20)

"""`dcgm watch --prometheus` against a real Prometheus scraping the recorded exporter."""

from __future__ import annotations

import json
import shutil
import subprocess
import time

import httpx
import pytest
from dcgm_helpers import _exporter_handler, _free_port, _serve, data, run_cli

from zgtool.dcgm.sources import PrometheusSource
from zgtool.errors import TargetUnreachable

PROMETHEUS = shutil.which("prometheus") or shutil.which("prometheus", path="/usr/bin:/usr/local/bin")
pytestmark = pytest.mark.skipif(PROMETHEUS is None, reason="prometheus binary not installed (Debian package "
                                                           "'prometheus')")


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory):
    """A real Prometheus scraping the recorded-exporter server every second: one for the module (it takes
    ~5 s to scrape the first time), the tests only read it."""
    tmp_path, free_port = tmp_path_factory.mktemp("prometheus"), _free_port()
    exporter_server = _serve(_exporter_handler)
    exporter = next(exporter_server)
    # Both generations on one target. Prometheus rejects a whole scrape on a non-numeric
    # value or a second TYPE line, so those lines of the recordings are left out here.
    classic = [ln for ln in data("exporter_3x_a800_8gpu_mig.txt").splitlines() if "ERROR - FAILED" not in ln]
    renamed = [ln for ln in data("exporter_49_h100_2gpu.txt").splitlines()
               if not ln.startswith(("# HELP DCGM_FI_DEV_POWER_USAGE", "# TYPE DCGM_FI_DEV_POWER_USAGE"))]
    exporter.body = "\n".join(classic + renamed) + "\n"
    host_port = exporter.url.split("://", 1)[1]
    cfg = tmp_path / "prometheus.yml"
    cfg.write_text(
        "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
        "scrape_configs:\n  - job_name: dcgm\n    static_configs:\n"
        f"      - targets: ['{host_port}']\n"
    )
    url = f"http://127.0.0.1:{free_port}"
    log = open(tmp_path / "prometheus.log", "wb")
    proc = subprocess.Popen(
        [PROMETHEUS, f"--config.file={cfg}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
         f"--web.listen-address=127.0.0.1:{free_port}"],
        stdout=log, stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + 45
        while True:
            assert proc.poll() is None, (tmp_path / "prometheus.log").read_text()[-2000:]
            try:
                r = httpx.get(f"{url}/api/v1/query", params={"query": "DCGM_FI_DEV_FB_USED"}, timeout=2)
                if r.status_code == 200 and len(r.json()["data"]["result"]) >= 10:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "Prometheus did not scrape the exporter within 45 s"
            time.sleep(0.3)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
        log.close()
        exporter_server.close()


def test_prometheus_source_reads_back_the_exporter_values_through_promql(prometheus):
    proc = run_cli("dcgm", "watch", "--prometheus", prometheus, "--once", "--json")
    assert proc.returncode == 0, proc.stderr
    d = json.loads(proc.stdout)["data"]
    assert d["source"]["kind"] == "prometheus"
    rows = {g["key"]: g["last"] for g in d["gpus"]}
    # both exporter generations on one scrape target, one row per GPU / MIG instance
    assert len(rows) == 12
    assert rows["msxf-hpc-64-35-ai/gpu4"]["power_w"] == 58.643
    assert rows["msxf-hpc-64-35-ai/gpu4"]["fb_free_bytes"] == 81226 * 1024 * 1024
    assert rows["msxf-hpc-64-35-ai/gpu0/mig5"]["sm_clock_mhz"] == 1410
    assert rows["h100-node-07/gpu0"]["mem_copy_util_pct"] == pytest.approx(91.0)
    assert rows["h100-node-07/gpu0"]["sm_clock_mhz"] == pytest.approx(1980.0)


def test_prometheus_selector_narrows_the_fleet(prometheus):
    src = PrometheusSource(prometheus, selector='hostname="h100-node-07"')
    rows = src.read()
    src.close()
    assert [r.key for r in rows] == ["h100-node-07/gpu0", "h100-node-07/gpu1"]


def test_prometheus_unreachable_is_target_unreachable(free_port):
    src = PrometheusSource(f"http://127.0.0.1:{free_port}")
    with pytest.raises(TargetUnreachable, match="cannot reach Prometheus"):
        src.read()
    src.close()

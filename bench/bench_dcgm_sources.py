"""Cost of one `dcgm watch` sample: direct dcgm-exporter scrape vs the Prometheus fleet path.

Serves the recorded 8-GPU A800 capture (tests/dcgm/data) on loopback, starts a real
Prometheus scraping it, then times N reads of each source in one run. Prints a table and,
as the last line, one JSON object with the figures and ratios.

    .venv/bin/python bench/bench_dcgm_sources.py [N]
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx

from zgtool.dcgm.sources import ExporterSource, PrometheusSource
from zgtool.http.net import free_port as _free_port
from zgtool.stats import summarize

DATA = Path(__file__).resolve().parent.parent / "tests" / "dcgm" / "data"


def _exporter(body: bytes) -> ThreadingHTTPServer:
    class H(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a: object) -> None:
            pass

    srv = ThreadingHTTPServer(("127.0.0.1", 0), H)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv


def _time_reads(src, n: int) -> list[float]:  # type: ignore[no-untyped-def]
    src.read()  # warm the connection
    out = []
    for _ in range(n):
        t = time.perf_counter()
        rows = src.read()
        out.append((time.perf_counter() - t) * 1000)
    assert len(rows) == 10
    return out


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 200
    prom_bin = shutil.which("prometheus") or shutil.which("prometheus", path="/usr/bin")
    if prom_bin is None:
        sys.exit("prometheus binary not installed; this benchmark compares against it")
    text = (DATA / "exporter_3x_a800_8gpu_mig.txt").read_text()
    # Prometheus rejects non-numeric values; the direct path gets the same lines for fairness.
    body = "\n".join(ln for ln in text.splitlines() if "ERROR - FAILED" not in ln).encode() + b"\n"
    srv = _exporter(body)
    exp_url = f"http://127.0.0.1:{srv.server_address[1]}"
    port = _free_port()
    with tempfile.TemporaryDirectory() as tmp:
        cfg = Path(tmp) / "p.yml"
        cfg.write_text("global:\n  scrape_interval: 1s\nscrape_configs:\n  - job_name: dcgm\n"
                       f"    static_configs:\n      - targets: ['127.0.0.1:{srv.server_address[1]}']\n")
        proc = subprocess.Popen([prom_bin, f"--config.file={cfg}", f"--storage.tsdb.path={tmp}/tsdb",
                                 f"--web.listen-address=127.0.0.1:{port}"],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            prom_url = f"http://127.0.0.1:{port}"
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                try:
                    r = httpx.get(f"{prom_url}/api/v1/query", params={"query": "DCGM_FI_DEV_FB_USED"})
                    if len(r.json()["data"]["result"]) >= 10:
                        break
                except (httpx.HTTPError, KeyError, ValueError):
                    pass
                time.sleep(0.3)
            direct, prom = ExporterSource(exp_url), PrometheusSource(prom_url)
            d_ms, p_ms = _time_reads(direct, n), _time_reads(prom, n)
            direct.close()
            prom.close()
        finally:
            proc.terminate()
            proc.wait(10)
            srv.shutdown()
    d, p = summarize(d_ms), summarize(p_ms)
    print(f"dcgm watch: one sample of 10 GPU rows (8x A800 capture, 3 MIG), n={n}")
    print(f"{'path':<28}{'p50 ms':>10}{'p90 ms':>10}{'p99 ms':>10}")
    print(f"{'direct dcgm-exporter':<28}{d['p50']:>10.2f}{d['p90']:>10.2f}{d['p99']:>10.2f}")
    print(f"{'Prometheus PromQL query':<28}{p['p50']:>10.2f}{p['p90']:>10.2f}{p['p99']:>10.2f}")
    print(f"prometheus / direct (p50): {p['p50'] / d['p50']:.2f}x")
    print(json.dumps({"bench": "dcgm_sources", "n": n, "gpu_rows": 10,
                      "direct_p50_ms": round(d["p50"], 3), "direct_p99_ms": round(d["p99"], 3),
                      "prometheus_p50_ms": round(p["p50"], 3), "prometheus_p99_ms": round(p["p99"], 3),
                      "prometheus_over_direct_p50": round(p["p50"] / d["p50"], 3)}))


if __name__ == "__main__":
    main()

"""bench --timeout-s: k6's per-request timeout, in the shared option vocabulary (real k6, real uvicorn)."""

from __future__ import annotations

import json

from zgtool.errors import ExitCode
from zgtool.loadtest import BenchConfig, find_k6, run_bench
from zgtool.loadtest.bench import bench_env
from zgtool.targets import Target


def test_a_request_slower_than_timeout_s_fails_in_k6(asgi_url, tmp_path):
    payload = tmp_path / "slow.json"      # the app holds a "slow-me" answer 0.3 s
    payload.write_text(json.dumps({"model": "default", "max_tokens": 4,
                                   "messages": [{"role": "user", "content": "slow-me"}]}))
    cfg = BenchConfig(rate_rps=4, duration_s=1.0, scenarios=("direct",), payload=payload, request_timeout_s=0.1)
    assert bench_env(cfg, Target("direct", asgi_url), None, payload)["REQUEST_TIMEOUT"] == "100ms"
    result = run_bench(cfg, direct=Target("direct", asgi_url), gateway=None, k6=find_k6(),
                       run_dir=tmp_path / "run", progress=False)
    s = result.scenarios["direct"]
    assert s.requests >= 4 and s.failures == s.requests


def test_timeout_s_must_be_positive(cli, asgi_url):
    proc = cli("bench", "--direct", asgi_url, "--scenarios", "direct", "--timeout-s", "0")
    assert proc.returncode == ExitCode.USAGE
    assert "--timeout-s must be a positive number of seconds" in proc.stderr

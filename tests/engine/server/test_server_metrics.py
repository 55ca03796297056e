"""/metrics: zg_ histograms, counters and engine gauges after real traffic; the access log."""

from __future__ import annotations

import json
from typing import Any

import httpx

from zgtool.verify.engine_metrics import derive, parse_metrics

MSGS = [{"role": "user", "content": "hi"}]


def test_metrics_cover_latency_tokens_finish_reasons_errors_and_engine_state(start_server: Any, tmp_path: Any) -> None:
    log = tmp_path / "access.jsonl"
    with start_server(access_log=log) as srv:
        for _ in range(3):
            httpx.post(srv.url + "/v1/messages", json={"model": "null", "max_tokens": 5, "messages": MSGS})
        httpx.post(srv.url + "/v1/messages", json={"model": "null", "max_tokens": 5, "stream": True, "messages": MSGS})
        httpx.post(srv.url + "/v1/messages", content=b"{")
        srv.wait_metric("zg_e2e_request_latency_seconds_count", 4)
        m = srv.metric
        assert m("zg_time_to_first_token_seconds_count") == 4
        assert m("zg_inter_token_latency_seconds_count") == 4 * 4
        assert m("zg_request_queue_time_seconds_count") == 4
        assert m("zg_prompt_tokens_total") > 0 and m("zg_generation_tokens_total") == 20
        assert m("zg_request_success_total", finished_reason="length") == 4
        assert m("zg_request_errors_total", error_type="invalid_request_error") == 1
        for gauge in ("zg_num_requests_running", "zg_num_requests_waiting", "zg_kv_cache_usage_perc",
                      "zg_kv_blocks_total", "zg_prefix_cache_queries_total", "zg_prefix_cache_hits_total",
                      "zg_admission_cap_factor"):
            m(gauge)
        assert m("zg_prefix_cache_queries_total") > 0
        # one request at a time, 5 tokens each: 5 steps of one sequence per request (the 400 never reached the engine)
        assert m("zg_engine_steps_total") == 4 * 5 and m("zg_engine_step_sequences_total") == 4 * 5
        derived = derive(parse_metrics(httpx.get(srv.url + "/metrics").text)["values"])   # verify's engine.metrics
        assert derived["engine_steps"] == 20 and derived["mean_batch"] == 1.0
    lines = [json.loads(x) for x in log.read_text().splitlines()]
    assert len(lines) == 5
    ok = lines[0]
    assert ok["status"] == 200 and ok["finish_reason"] == "length" and ok["completion_tokens"] == 5
    assert {"queue_ms", "prefill_ms", "decode_ms", "detok_ms", "safety_ms", "total_ms", "ttft_ms"} <= set(ok)
    assert lines[3]["stream"] is True
    assert lines[4]["status"] == 400 and lines[4]["error_type"] == "invalid_request_error"

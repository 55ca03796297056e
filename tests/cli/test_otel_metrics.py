"""zgtool/otel_metrics.py alone: OTLP's bucket rule (upper bound inclusive), the endpoint URL rules, and
the hand-written protobuf read back by the official opentelemetry-proto classes."""

from __future__ import annotations

import pytest

from zgtool.errors import UsageError
from zgtool.otel_metrics import DURATION, DURATION_BUCKETS_S, TPOC, Histogram, Recorder, metrics_url


def test_a_value_on_a_bound_falls_in_that_bound_bucket() -> None:
    h = Histogram((0.01, 0.02))
    for v in (0.005, 0.01, 0.015, 0.02, 0.5):
        h.record(v)
    assert h.counts == [2, 2, 1] and h.count == 5 and (h.min, h.max) == (0.005, 0.5)


def test_endpoint_urls_follow_the_otlp_exporter_rules() -> None:
    assert metrics_url("http://collector:4318") == "http://collector:4318/v1/metrics"
    assert metrics_url("http://collector:4318/") == "http://collector:4318/v1/metrics"
    assert metrics_url("https://c.example/otlp/v1/metrics") == "https://c.example/otlp/v1/metrics"
    for bad in ("collector:4318", "ftp://c/x", "http://:4318", "http://c:99999"):
        with pytest.raises(UsageError, match="--otlp-endpoint"):
            metrics_url(bad)


def test_the_encoding_reads_back_with_the_official_classes() -> None:
    pb = pytest.importorskip("opentelemetry.proto.collector.metrics.v1.metrics_service_pb2")
    r = Recorder()
    base = {"gen_ai.operation.name": "chat", "server.port": 8443, "zgtool.path": "pygw"}
    r.record(DURATION, base, 0.3)
    r.record(DURATION, {**base, "error.type": "529"}, 0.05)
    r.record(TPOC, base, 0.001)
    req = pb.ExportMetricsServiceRequest.FromString(r.encode())
    (rm,) = req.resource_metrics
    assert rm.resource.attributes[0].key == "service.name" and rm.scope_metrics[0].scope.name == "zgtool"
    metrics = {m.name: m for m in rm.scope_metrics[0].metrics}
    assert set(metrics) == {DURATION, TPOC}
    points = metrics[DURATION].histogram.data_points
    assert [p.count for p in points] == [1, 1] and list(points[0].explicit_bounds) == list(DURATION_BUCKETS_S)
    assert {kv.key: kv.value.int_value for kv in points[0].attributes if kv.key == "server.port"} == \
        {"server.port": 8443}
    assert points[1].bucket_counts[3] == 1 and points[1].sum == pytest.approx(0.05)   # 0.04 < 0.05 <= 0.08
    assert points[0].start_time_unix_nano <= points[0].time_unix_nano

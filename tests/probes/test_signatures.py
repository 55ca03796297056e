"""Signature matching over real-world response-header samples (values shaped like captured ones)."""

from __future__ import annotations

import pytest

from zgtool.probes.headers import analyse_headers
from zgtool.probes.signatures import load_database

H = list[tuple[str, str]]

ANTHROPIC_API: H = [
    ("Date", "Tue, 14 Oct 2025 10:00:00 GMT"), ("Content-Type", "application/json"),
    ("anthropic-ratelimit-requests-limit", "4000"), ("anthropic-ratelimit-requests-remaining", "3999"),
    ("request-id", "req_011CTxyzAbCdEfGh"), ("anthropic-organization-id", "0a1b2c3d-0000-4000-8000-1234567890ab"),
    ("via", "1.1 google"), ("cf-cache-status", "DYNAMIC"), ("Server", "cloudflare"), ("CF-RAY", "98e1a2b3c4d5e6f7-FRA"),
]
OPENAI_API: H = [
    ("server", "cloudflare"), ("openai-organization", "user-abc"), ("openai-processing-ms", "412"),
    ("openai-version", "2020-10-01"), ("x-ratelimit-limit-requests", "10000"),
    ("x-request-id", "req_8a7b6c5d4e3f"), ("cf-cache-status", "DYNAMIC"), ("cf-ray", "8f0e1d2c3b4a5968-AMS"),
]
FASTLY: H = [
    ("Via", "1.1 varnish, 1.1 varnish"), ("X-Served-By", "cache-iad-kiad7000025-IAD, cache-fra-etou8220023-FRA"),
    ("X-Cache", "MISS, HIT"), ("X-Cache-Hits", "0, 1"), ("X-Timer", "S1700000000.123456,VS0,VE1"),
]
CLOUDFRONT_APIGW: H = [
    ("x-amzn-RequestId", "3f1c5b7e-1111-2222-3333-444455556666"), ("x-amz-apigw-id", "Ab1CdEfGhIJKLmN="),
    ("X-Amzn-Trace-Id", "Root=1-65f0c0de-1234567890abcdef01234567"), ("X-Cache", "Miss from cloudfront"),
    ("Via", "1.1 7c8d9e0f1a2b3c4d.cloudfront.net (CloudFront)"), ("X-Amz-Cf-Pop", "FRA56-P1"),
    ("X-Amz-Cf-Id", "q0vF1l2M3n4O5p6Q7r8S9t0U=="),
]
ENVOY: H = [("server", "envoy"), ("x-envoy-upstream-service-time", "12"), ("content-type", "application/json")]
ISTIO: H = [("server", "istio-envoy"), ("x-envoy-decorator-operation", "llm.default.svc.cluster.local:8000/*")]
KONG: H = [("Via", "kong/3.4.2"), ("X-Kong-Upstream-Latency", "180"), ("X-Kong-Proxy-Latency", "2"),
           ("X-Kong-Request-Id", "1c6f5e0a9b7d4c3e2f1a0b9c8d7e6f5a")]
LITELLM: H = [
    ("server", "uvicorn"), ("x-litellm-call-id", "b1c2d3e4-aaaa-bbbb-cccc-ddddeeeeffff"),
    ("x-litellm-response-duration-ms", "512.3"), ("x-litellm-overhead-duration-ms", "4.1"),
    ("x-litellm-model-api-base", "https://api.openai.com"), ("llm_provider-openai-processing-ms", "401"),
    ("x-ratelimit-remaining-requests", "9999"),
]
PORTKEY: H = [("x-portkey-trace-id", "c0ffee00-1234"), ("x-portkey-cache-status", "MISS"),
              ("x-portkey-retry-attempt-count", "0")]
CF_AI_GATEWAY: H = [("server", "cloudflare"), ("cf-ray", "9a0b1c2d3e4f5061-LHR"), ("cf-aig-cache-status", "MISS"),
                    ("cf-aig-log-id", "01J0ABCDEF"), ("cf-aig-step", "0")]
AZURE_OPENAI: H = [("apim-request-id", "5d1b3a2e-0000-1111-2222-333344445555"), ("x-ms-region", "East US"),
                   ("x-request-id", "2b8e7c1a-aaaa"), ("azureml-model-session", "d123")]
AZURE_FRONT_DOOR: H = [("x-azure-ref", "20250101T000000Z-17b5c8d9e8f9tl7shC1FRAxyz0000000000000"),
                       ("x-cache", "CONFIG_NOCACHE")]
GOOGLE: H = [("server", "Google Frontend"), ("via", "1.1 google"),
             ("x-cloud-trace-context", "105445aa7843bc8bf206b12000100000/1;o=1")]
AKAMAI: H = [("Server", "AkamaiGHost"), ("x-akamai-transformed", "9 - 0 pmb=mRUM,1")]
AWS_ALB_502: H = [("Server", "awselb/2.0"), ("Content-Type", "text/html")]
CADDY: H = [("Server", "Caddy"), ("Via", "1.1 Caddy")]
ZG_DIRECT: H = [
    ("server", "zgtool-engine/0.1.0"), ("request-id", "inference-8f3a"), ("x-request-id", "inference-8f3a"),
    ("server-timing", "queue;dur=0.010, prefill;dur=0.200, decode;dur=1.100, detok;dur=0.020, safety;dur=0.000, "
                      "total;dur=1.500"),
    ("x-gpu-load-hint", '{"kv_util": 0.02, "running": 1, "waiting": 0}'),
]
ZG_NGINX: H = [("Server", "nginx/1.22.1"), *[h for h in ZG_DIRECT if h[0] != "server"]]
ZG_PYGW: H = [
    ("server", "uvicorn"), ("request-id", "inference-8f3a"), ("via", "1.1 pygw"), ("x-backend-server", "127.0.0.1:8000"),
    ("x-request-id", "gateway-0123456789abcdef"), ("x-upstream-request-id", "inference-8f3a"),
    ("server-timing", "queue;dur=0.01, prefill;dur=0.2, decode;dur=1.1, total;dur=1.5, gw_auth;dur=0.05, "
                      "gw_upstream;dur=2.2"),
]
ZG_STACK: H = [("Server", "nginx/1.22.1"), *[h for h in ZG_PYGW if h[0] != "server"]]

CASES = [
    ("anthropic-api", ANTHROPIC_API, {"anthropic-api"}, {"cloudflare", "google-frontend"}, 2),
    ("openai-api", OPENAI_API, {"openai-api"}, {"cloudflare"}, 1),
    ("fastly", FASTLY, set(), {"fastly"}, 2),
    ("cloudfront+apigw", CLOUDFRONT_APIGW, set(), {"cloudfront", "aws-apigw"}, 2),
    ("envoy", ENVOY, set(), {"envoy"}, 1),
    ("istio", ISTIO, set(), {"envoy"}, 1),
    ("kong", KONG, set(), {"kong"}, 1),
    # the provider is seen in the headers LiteLLM passes on (llm_provider-openai-processing-ms)
    ("litellm", LITELLM, {"openai-api"}, {"litellm"}, 1),
    ("portkey", PORTKEY, set(), {"portkey"}, 1),
    ("cloudflare-ai-gateway", CF_AI_GATEWAY, set(), {"cloudflare", "cloudflare-ai-gateway"}, 2),
    ("azure-openai", AZURE_OPENAI, {"azure-openai"}, {"azure-apim"}, 1),
    ("azure-front-door", AZURE_FRONT_DOOR, set(), {"azure-frontdoor"}, 1),
    ("google", GOOGLE, set(), {"google-frontend"}, 1),
    ("akamai", AKAMAI, set(), {"akamai"}, 1),
    ("aws-alb", AWS_ALB_502, set(), {"aws-alb"}, 1),
    ("caddy", CADDY, set(), {"caddy"}, 1),
    ("zgtool direct", ZG_DIRECT, {"zgtool-engine"}, set(), 0),
    ("zgtool nginx", ZG_NGINX, {"zgtool-engine"}, {"nginx"}, 1),
    ("zgtool pygw", ZG_PYGW, {"zgtool-engine"}, {"zgtool-pygw"}, 1),
    ("zgtool stack", ZG_STACK, {"zgtool-engine"}, {"nginx", "zgtool-pygw"}, 2),
]


@pytest.mark.parametrize(("label", "headers", "origin", "inter", "hops"), CASES, ids=[c[0] for c in CASES])
def test_real_world_headers_identify_origin_intermediaries_and_hops(
        label: str, headers: H, origin: set[str], inter: set[str], hops: int) -> None:
    a = analyse_headers(headers)
    assert {d.id for d in a.origin} == origin
    assert {d.id for d in a.intermediaries} == inter
    assert a.hop_estimate == hops
    for d in a.intermediaries + a.origin:
        assert d.evidence and 0 < d.confidence <= 1


def test_error_bodies_identify_proxies_that_send_no_header() -> None:
    haproxy = analyse_headers([("content-type", "text/html")],
                              "<html><body><h1>503 Service Unavailable</h1>\nNo server is available to handle "
                              "this request.\n</body></html>")
    assert [d.id for d in haproxy.intermediaries] == ["haproxy"]
    nginx = analyse_headers([], "<html><head><title>502 Bad Gateway</title></head><body>"
                                "<center><h1>502 Bad Gateway</h1></center><hr><center>nginx</center></body></html>")
    assert [d.id for d in nginx.intermediaries] == ["nginx"]


def test_evidence_names_the_header_and_value_that_matched() -> None:
    a = analyse_headers(ZG_NGINX)
    nginx = a.intermediaries[0]
    assert nginx.evidence[0].what == "server: nginx/1.22.1" and nginx.level == "high"


def test_engine_evidence_without_its_server_header_flags_an_unidentified_hop_with_low_confidence() -> None:
    a = analyse_headers([h for h in ZG_DIRECT if h[0] != "server"])
    assert [(d.id, d.level) for d in a.intermediaries] == [("unidentified", "low")]
    assert a.hop_estimate == 0  # low confidence does not count as a hop


def test_no_evidence_still_carries_the_caveat() -> None:
    a = analyse_headers([("content-type", "application/json")])
    assert a.origin == [] and a.intermediaries == [] and a.hop_estimate == 0
    assert "not proof" in a.caveat


def test_request_ids_load_hint_and_rate_limits_are_parsed() -> None:
    a = analyse_headers(ZG_PYGW + [("x-gpu-load-hint", '{"kv_util": 0.5, "running": 2, "waiting": 1}'),
                                   ("anthropic-ratelimit-tokens-remaining", "900"), ("retry-after", "2")])
    assert a.request_id_prefixes == {"request-id": "inference-", "x-request-id": "gateway-",
                                     "x-upstream-request-id": "inference-"}
    assert a.load_hint == {"kv_util": 0.5, "running": 2, "waiting": 1}
    assert a.rate_limits == {"anthropic-ratelimit-tokens-remaining": "900", "retry-after": "2"}
    assert [m.name for m in a.server_timing][-2:] == ["gw_auth", "gw_upstream"]


def test_an_unparsable_load_hint_is_reported_not_dropped() -> None:
    a = analyse_headers([("x-gpu-load-hint", "sm=90%")])
    assert a.load_hint is None and "not JSON" in (a.load_hint_error or "")


def test_the_signature_database_covers_every_named_system() -> None:
    ids = {s["id"] for s in load_database()["signatures"]}
    assert {"nginx", "envoy", "haproxy", "varnish", "fastly", "akamai", "cloudfront", "aws-alb", "aws-apigw",
            "azure-frontdoor", "azure-apim", "google-frontend", "cloudflare", "cloudflare-ai-gateway", "traefik",
            "caddy", "kong", "litellm", "portkey", "zgtool-pygw", "zgtool-engine"} <= ids

"""Which engine answers behind a URL, named from its own evidence, whatever sits in front of it.

Evidence, strongest first: what the engine writes into the answer's body (`system_fingerprint:
"vllm-0.32.0-..."`, llama.cpp's `timings`, vLLM's per-request `metrics`), which every hop that passes the
body on keeps; the answer's headers (`Server: llama.cpp`, `zgtool-engine/...`, TGI's `x-compute-*`, and the
same under LiteLLM's `llm_provider-` prefix, the upstream's headers it forwards); then the engine's own
routes at that address (`/version`, `/props`, `/info`, `/api/version`, the metric names of `/metrics`).

Formats: vLLM and llama.cpp from recorded answers (tests/latency/fixtures/engines/vllm_*.txt,
llamaserver_*.txt); TGI, SGLang and Ollama from their documented formats (*_documented_*.txt)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import httpx

# the upstream's headers as LiteLLM forwards them
FORWARDED_PREFIXES = ("", "llm_provider-")
METRICS_READ_BYTES = 256 * 1024
# metric name prefix -> engine (vLLM docs/design/metrics.md, SGLang, TGI router, llama-server, zgtool engine)
METRIC_PREFIXES = (("vllm:", "vLLM"), ("sglang:", "SGLang"), ("tgi_", "TGI"), ("llamacpp:", "llama.cpp"),
                   ("zg_num_requests_running", "zgtool engine"))
_LLAMA_FINGERPRINT = re.compile(r"^b\d+-[0-9a-f]{6,}$")


@dataclass(frozen=True)
class EngineName:
    name: str                    # vLLM, llama.cpp, SGLang, TGI, Ollama, zgtool engine
    version: str | None
    evidence: str                # where it was read, in words

    def public(self) -> dict[str, str | None]:
        return {"name": self.name, "version": self.version, "evidence": self.evidence}

    def label(self) -> str:
        return f"{self.name} {self.version}" if self.version else self.name


def _header(headers: Mapping[str, str], name: str) -> tuple[str, str] | None:
    for prefix in FORWARDED_PREFIXES:
        value = headers.get(prefix + name)
        if value:
            return prefix + name, value
    return None


def from_body(doc: Any) -> EngineName | None:
    """The engine named by what it wrote into an answer's JSON body."""
    if not isinstance(doc, dict):
        return None
    fp = doc.get("system_fingerprint")
    if isinstance(fp, str) and fp.startswith("vllm-"):
        return EngineName("vLLM", fp[5:].split("-")[0] or None, f'system_fingerprint "{fp}"')
    if isinstance(fp, str) and _LLAMA_FINGERPRINT.match(fp):
        return EngineName("llama.cpp", fp.split("-")[0], f'system_fingerprint "{fp}" (llama.cpp build-commit)')
    timings = doc.get("timings")
    if isinstance(timings, dict) and "predicted_n" in timings:
        return EngineName("llama.cpp", None, "the body's timings.predicted_n")
    metrics = doc.get("metrics")
    if isinstance(metrics, dict) and "queue_time_ms" in metrics and "time_to_first_token_ms" in metrics:
        return EngineName("vLLM", None, "the body's metrics (vLLM --enable-per-request-metrics)")
    if isinstance(doc.get("meta_info"), dict) and "e2e_latency" in doc["meta_info"]:
        return EngineName("SGLang", None, "the body's meta_info")
    if "eval_count" in doc and "prompt_eval_count" in doc:
        return EngineName("Ollama", None, "the body's eval_count/prompt_eval_count")
    return None


def from_headers(headers: Mapping[str, str]) -> EngineName | None:
    """The engine named by an answer's headers (lower-case names), its own or forwarded by LiteLLM."""
    for name, value in ((p + "server", headers.get(p + "server", "")) for p in FORWARDED_PREFIXES):
        if value.startswith("zgtool-engine"):
            return EngineName("zgtool engine", value.partition("/")[2] or None, f"{name}: {value}")
        if value.startswith("llama.cpp"):
            return EngineName("llama.cpp", None, f"{name}: {value}")
    compute = _header(headers, "x-compute-type")
    if compute is not None and _header(headers, "x-compute-time") is not None:
        return EngineName("TGI", None, f"{compute[0]}: {compute[1]} (TGI's router)")
    return None


def from_answer(r: httpx.Response) -> EngineName | None:
    """The engine named by one answer: its body first (it crosses every hop), then its headers."""
    try:
        doc = r.json()
    except ValueError:
        doc = None
    return from_body(doc) or from_headers({k.lower(): v for k, v in r.headers.items()})


def _get_json(client: httpx.Client, url: str) -> Any:
    try:
        r = client.get(url)
        return r.json() if r.status_code == 200 else None
    except (httpx.HTTPError, ValueError):
        return None


def _from_metrics(client: httpx.Client, url: str) -> EngineName | None:
    """The engine named by its metric names (at most METRICS_READ_BYTES of /metrics read)."""
    try:
        with client.stream("GET", url) as r:
            if r.status_code != 200:
                return None
            seen = b""
            for chunk in r.iter_bytes():
                seen += chunk
                if len(seen) >= METRICS_READ_BYTES:
                    break
    except httpx.HTTPError:
        return None
    text = seen.decode("utf-8", "replace")
    for prefix, name in METRIC_PREFIXES:
        if re.search(rf"^(# (TYPE|HELP) )?{re.escape(prefix)}", text, re.M):
            return EngineName(name, None, f"GET /metrics names {prefix}*")
    return None


def from_routes(base: str, *, timeout_s: float, verify: bool | str = True,
                headers: Mapping[str, str] | None = None) -> EngineName | None:
    """The engine named by its own routes at `base` (the URL before /v1): /version (vLLM), /props
    (llama.cpp), /info (TGI), /api/version (Ollama), /get_server_info (SGLang), then /metrics's names."""
    with httpx.Client(timeout=timeout_s, verify=verify, trust_env=False, headers=dict(headers or {})) as client:
        props = _get_json(client, base + "/props")
        if isinstance(props, dict) and ("default_generation_settings" in props or "build_info" in props):
            build = props.get("build_info")
            return EngineName("llama.cpp", build if isinstance(build, str) else None, "GET /props")
        info = _get_json(client, base + "/info")
        if isinstance(info, dict) and "model_id" in info and "router" in info:
            return EngineName("TGI", info.get("version"), "GET /info")
        sgl = _get_json(client, base + "/get_server_info")
        if isinstance(sgl, dict) and "tokenizer_path" in sgl:
            return EngineName("SGLang", sgl.get("version"), "GET /get_server_info")
        version = _get_json(client, base + "/version")
        if isinstance(version, dict) and isinstance(version.get("version"), str) and len(version) == 1:
            named = _from_metrics(client, base + "/metrics")
            name = named.name if named is not None else "vLLM"
            return EngineName(name, version["version"], "GET /version" + (f" and {named.evidence}" if named
                                                                          else " (vLLM's shape)"))
        ollama = _get_json(client, base + "/api/version")
        if isinstance(ollama, dict) and isinstance(ollama.get("version"), str):
            return EngineName("Ollama", ollama["version"], "GET /api/version")
        return _from_metrics(client, base + "/metrics")

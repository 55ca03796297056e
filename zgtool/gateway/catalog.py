"""The catalogue of gateway kinds: every kind and supervisor path, their labels, and how a launched
gateway is planned (LaunchRequest -> Launch, written by the kind's own module: haproxy, caddy, ...).

A leaf of zgtool.gateway: it imports nothing of the supervisor, so the supervisor, the renderers and
each kind's module import it, and zgtool.gateway.kinds (start_gateway) builds on all of them.
"""

from __future__ import annotations

import string
from dataclasses import dataclass, field
from importlib import import_module
from importlib.resources import files
from pathlib import Path
from typing import Any

from zgtool.errors import UsageError

# what a user chooses (CLI --gateway / --kind, verify --gateway)
GATEWAY_KINDS = ("nginx", "pygw", "stack", "haproxy", "caddy", "litellm", "varnish", "squid")
BUFFERINGS = ("streaming", "buffered", "default")  # default: the gateway's shipped behaviour (haproxy only)
# kinds with a configuration that holds responses back (the `-buffered` path)
BUFFERED_PATH = {"nginx": "nginx-buffered", "haproxy": "haproxy-buffered", "caddy": "caddy-buffered",
                 "varnish": "varnish-buffered"}
# the paths started from a Launch (one process group each); module that plans each
LAUNCHED = {
    "haproxy": "haproxy", "haproxy-buffered": "haproxy", "haproxy-default": "haproxy",
    "caddy": "caddy", "caddy-buffered": "caddy",
    "varnish": "varnish", "varnish-buffered": "varnish", "squid": "squid", "litellm": "litellm",
}
# every path the supervisor can run
PATHS = ("nginx", "nginx-buffered", "pygw", "stack", *LAUNCHED)

LABELS = {
    "haproxy": "HAProxy -> {up}", "haproxy-buffered": "HAProxy (wait-for-body) -> {up}",
    "haproxy-default": "HAProxy (shipped defaults: SSE coalesced) -> {up}",
    "caddy": "Caddy -> {up}", "caddy-buffered": "Caddy (buffer_responses) -> {up}",
    "varnish": "Varnish -> {up}", "varnish-buffered": "Varnish (do_stream off) -> {up}", "squid": "Squid (accelerator) -> {up}", "litellm": "LiteLLM proxy -> {up}",
}


def path_for(kind: str, buffering: str = "streaming") -> str:
    """The supervisor path of a kind in a buffering mode ("haproxy", "buffered" -> "haproxy-buffered")."""
    if kind in PATHS and kind not in GATEWAY_KINDS:  # already a path ("caddy-buffered")
        return kind
    if kind not in GATEWAY_KINDS:
        raise UsageError(f"unknown gateway kind {kind!r}; choose from {', '.join(GATEWAY_KINDS)}")
    if buffering not in BUFFERINGS:
        raise UsageError(f"buffering must be one of {', '.join(BUFFERINGS)}, not {buffering!r}")
    if buffering == "default":
        if kind != "haproxy":
            raise UsageError("buffering 'default' is HAProxy's shipped configuration (haproxy only)")
        return "haproxy-default"
    if buffering == "buffered":
        if kind not in BUFFERED_PATH:
            raise UsageError(f"{kind} has no buffered configuration here; buffered: {', '.join(BUFFERED_PATH)}")
        return BUFFERED_PATH[kind]
    return kind


@dataclass(frozen=True)
class LaunchRequest:
    """What a gateway process is asked to do: listen on host:port, proxy to upstream (a base URL)."""

    path: str
    host: str
    port: int
    upstream: str
    run_dir: Path
    keys_file: Path | None = None
    redis_url: str | None = None
    model: str | None = None  # the model name clients send (LiteLLM routes by it; others ignore it)
    forward_traceparent: bool = False  # LiteLLM: pass the client's traceparent on (the others do as is)
    otlp_traces_endpoint: str | None = None   # LiteLLM: export its own spans over OTLP/HTTP here

    @property
    def buffered(self) -> bool:
        return self.path.endswith("-buffered")

    @property
    def upstream_host_port(self) -> tuple[str, int]:
        if not self.upstream.startswith("http://"):
            raise UsageError(f"{self.path} fronts a plaintext upstream; give an http:// upstream URL, not {self.upstream!r}")
        netloc = self.upstream.split("://", 1)[1].split("/", 1)[0]
        host, _, port = netloc.rpartition(":")
        if not host or not port.isdigit():
            return netloc, 80
        return host.strip("[]"), int(port)


@dataclass(frozen=True)
class Launch:
    """How to run one gateway process: argv, extra environment, and how to see it is up."""

    argv: tuple[str, ...]
    config: Path
    env: dict[str, str] = field(default_factory=dict)
    ready_path: str = "/"
    ready_any_status: bool = True  # a proxy in front of a user's upstream may answer 404 or 502
    logs: tuple[Path, ...] = ()    # logs besides the process's own stdout/stderr


def plan_launch(req: LaunchRequest) -> Launch:
    """Write the gateway's configuration into req.run_dir and return how to run it.
    MissingCapability (exit 4, one line with the install command) when it is not installed."""
    module = LAUNCHED.get(req.path)
    if module is None:
        raise UsageError(f"{req.path} is not a launched gateway kind")
    launch: Launch = import_module(f"zgtool.gateway.{module}").launch(req)
    return launch


def render_template(name: str, **values: Any) -> str:
    """A template from zgtool/gateway/templates with ${name} placeholders (all must be given)."""
    text = files("zgtool.gateway").joinpath("templates", name).read_text()
    return string.Template(text).substitute({k: str(v) for k, v in values.items()})

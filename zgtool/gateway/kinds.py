"""Every gateway zgtool can put in front of an engine, behind one API.

    from zgtool.gateway.kinds import start_gateway, GATEWAY_KINDS

    with start_gateway("haproxy", "http://127.0.0.1:8000", run_dir, buffering="buffered") as gw:
        gw.url, gw.pids          # the front's URL; every process it runs
    # stopped: no process left, also on an exception or a failed start

Kinds: nginx, pygw and stack (nginx -> pygw) are zgtool's reference path; haproxy, caddy,
varnish, squid (Debian packages) and litellm (LiteLLM proxy, its own venv in the cache
dir) are the gateways people run. Each is a path of the LocalStack supervisor, so
`zgtool serve --gateway`, `zgtool gateway --kind` and `zgtool verify --gateway` take them
all; `-buffered` paths are the same gateway configured to hold responses back.

This module imports nothing heavy: the CLI reads GATEWAY_KINDS for its --help. The catalogue itself
(kinds, paths, labels, launch planning) is zgtool.gateway.catalog, re-exported here.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from zgtool.gateway.catalog import (
    BUFFERED_PATH,
    BUFFERINGS,
    GATEWAY_KINDS,
    LABELS,
    LAUNCHED,
    PATHS,
    Launch,
    LaunchRequest,
    path_for,
    plan_launch,
    render_template,
)

if TYPE_CHECKING:
    from zgtool.gateway.supervisor import LocalStack

__all__ = ["BUFFERED_PATH", "BUFFERINGS", "GATEWAY_KINDS", "LABELS", "LAUNCHED", "PATHS", "Gateway", "Launch",
           "LaunchRequest", "path_for", "plan_launch", "render_template", "start_gateway"]


@dataclass
class Gateway:
    """A running gateway (and nothing else: the upstream is the caller's)."""

    kind: str
    path: str
    stack: LocalStack

    @property
    def url(self) -> str:
        return self.stack.urls[self.path]

    @property
    def upstream(self) -> str:
        return self.stack.urls["direct"]

    @property
    def pids(self) -> list[int]:
        return self.stack.pids

    @property
    def pid(self) -> int:
        return self.stack.pids[0]

    @property
    def run_dir(self) -> Path:
        return self.stack.run_dir

    def logs(self) -> dict[str, Path]:
        return self.stack.logs()

    def stop(self) -> None:
        """Stop every process of the gateway (SIGTERM, then SIGKILL after the grace)."""
        self.stack.__exit__(None, None, None)

    def __enter__(self) -> Gateway:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def start_gateway(
    kind: str,
    upstream_url: str,
    run_dir: Path,
    port: int | None = None,
    *,
    buffering: str = "streaming",
    redis_url: str | None = None,
    keys_file: Path | None = None,
    host: str = "127.0.0.1",
    model: str | None = None,
    start_timeout_s: float = 180.0,
    stop_grace_s: float = 5.0,
    **opts: Any,
) -> Gateway:
    """Start `kind` in front of upstream_url on a free loopback port (or `port`), logs and
    configs in run_dir; returns once it answers. A failed start leaves no process and
    raises (StartFailed naming the log, or MissingCapability naming the install command).
    Other opts go to StackConfig (e.g. tls=True, basic_auth=(u, p) for nginx fronts)."""
    from zgtool.gateway.supervisor import LocalStack, StackConfig

    path = path_for(kind, buffering)
    cfg = StackConfig(
        paths=(path,), upstream=upstream_url, gateway_port=port, host=host, run_dir=Path(run_dir),
        pygw_keys=keys_file, redis_url=redis_url, gateway_model=model, start_timeout_s=start_timeout_s,
        stop_grace_s=stop_grace_s, **opts,
    )
    stack = LocalStack(cfg)
    stack.__enter__()  # on failure it has already stopped what it started
    return Gateway(kind, path, stack)

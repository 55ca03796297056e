"""Caddy (Debian 2.6) as a gateway: a Caddyfile in the run folder, `caddy run` in the foreground,
admin API off, its storage (XDG dirs) inside the run folder.

Streaming: Caddy's default (a text/event-stream answer is flushed as it comes; the
Caddyfile also says `flush_interval -1`), with the request body read whole first
(`buffer_requests`): without it Debian's 2.6 cut about 1 in 100 streamed POST answers after
their first event (Go's HTTP/1 server closes the client's body at the answer's first write while
the upstream transport may still be reading it; caddyserver/caddy#5431). Buffered:
`buffer_requests` + `buffer_responses`, which read a whole body into memory before passing it on."""

from __future__ import annotations

from zgtool.gateway.admin_deny import ADMIN_DENIED_JSON, ADMIN_RAW_PATH_RE
from zgtool.gateway.binaries import find_binary
from zgtool.gateway.catalog import Launch, LaunchRequest, render_template

INSTALL = "sudo apt-get install -y caddy"

_STREAMING = "\t\tflush_interval -1\n\t\tbuffer_requests\n"
_BUFFERED = "\t\tbuffer_requests\n\t\tbuffer_responses\n"


def launch(req: LaunchRequest) -> Launch:
    binary = find_binary("caddy", INSTALL)
    up_host, up_port = req.upstream_host_port
    config = req.run_dir / f"{req.path}.Caddyfile"
    access_log = req.run_dir / f"{req.path}-access.log"
    config.write_text(render_template(
        "Caddyfile.tmpl", admin_json=ADMIN_DENIED_JSON, admin_re=ADMIN_RAW_PATH_RE, mode="buffered" if req.buffered else "streaming", config=config, host=req.host,
        port=req.port, upstream=f"{up_host}:{up_port}", access_log=access_log,
        buffering=_BUFFERED if req.buffered else _STREAMING,
    ))
    state = req.run_dir / f"{req.path}-state"
    env = {"XDG_DATA_HOME": str(state / "data"), "XDG_CONFIG_HOME": str(state / "config"), "HOME": str(state)}
    return Launch(argv=(binary, "run", "--config", str(config), "--adapter", "caddyfile"), config=config, env=env,
                  logs=(access_log,))

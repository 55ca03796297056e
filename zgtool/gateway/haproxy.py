"""HAProxy (Debian 2.6) as a gateway: a config in the run folder, run in the foreground.

Streaming: `option http-no-delay`. Without it (HAProxy's default) HAProxy sends body data
that is not the message's end with MSG_MORE, so the kernel holds small SSE events back
(measured here: the first ~6 of 8 events 30 ms apart arrived together, ~170 ms late).
Buffered: what an API edge with body inspection runs, `http-request wait-for-body` and
`http-response wait-for-body`, which hold a response back until it is complete, its buffer
is full or the wait time has passed. `haproxy-default` (buffering="default"): neither, HAProxy
as shipped, for the probes that must tell its coalesced SSE apart."""

from __future__ import annotations

from zgtool.gateway.admin_deny import ADMIN_DENIED_JSON, ADMIN_RAW_PATH_RE
from zgtool.gateway.binaries import find_binary
from zgtool.gateway.catalog import Launch, LaunchRequest, render_template

INSTALL = "sudo apt-get install -y haproxy"
BUFFER_WAIT_S = 10  # the longest a buffered response is held before it is sent anyway

_STREAMING = "    # streaming: no MSG_MORE on partial bodies (each SSE event leaves at once)\n    option http-no-delay\n"
_BUFFERED = (
    "    # buffered: hold the request and the response body (up to the wait or a full buffer)\n"
    "    http-request wait-for-body time 1s\n"
    f"    http-response wait-for-body time {BUFFER_WAIT_S}s\n"
)


def _buffering(path: str) -> str:
    if path == "haproxy-default":
        return "    # HAProxy's defaults: partial bodies leave with MSG_MORE (small SSE events coalesce)\n"
    return _BUFFERED if path == "haproxy-buffered" else _STREAMING


def launch(req: LaunchRequest) -> Launch:
    binary = find_binary("haproxy", INSTALL)
    up_host, up_port = req.upstream_host_port
    config = req.run_dir / f"{req.path}.cfg"
    config.write_text(render_template(
        "haproxy.cfg.tmpl", admin_json=ADMIN_DENIED_JSON, admin_re=ADMIN_RAW_PATH_RE, mode=req.path, config=config,
        host=req.host, port=req.port, upstream=f"{up_host}:{up_port}", buffering=_buffering(req.path),
    ))
    return Launch(argv=(binary, "-db", "-f", str(config)), config=config)

"""Varnish (Debian 7.1) as a gateway: the built-in VCL behaviour (POST passed to the backend,
streaming on), `varnishd -F` in the foreground with its working folder in the run folder.
`varnish-buffered`: `beresp.do_stream = false`, Varnish's knob that fetches a whole body
before delivering it.
`-j none`: no privilege separation, so the run folder needs no varnish-user access."""

from __future__ import annotations

from zgtool.gateway.admin_deny import ADMIN_DENIED_JSON, ADMIN_RAW_PATH_RE
from zgtool.gateway.binaries import find_binary
from zgtool.gateway.catalog import Launch, LaunchRequest, render_template

INSTALL = "sudo apt-get install -y varnish"
_BUFFERED = "\nsub vcl_backend_response {\n    set beresp.do_stream = false;\n}\n"


def launch(req: LaunchRequest) -> Launch:
    binary = find_binary("varnishd", INSTALL)
    up_host, up_port = req.upstream_host_port
    config = req.run_dir / f"{req.path}.vcl"
    config.write_text(render_template(
        "varnish.vcl.tmpl", admin_json=ADMIN_DENIED_JSON.replace('"}', '" }'),  # a VCL {"..."} string ends at "}
        admin_re=ADMIN_RAW_PATH_RE, config=config, host=req.host, port=req.port, upstream_host=up_host,
        upstream_port=up_port, mode="buffered: beresp.do_stream off" if req.buffered else "streaming (do_stream on)",
        backend_response=_BUFFERED if req.buffered else "",
    ))
    workdir = req.run_dir / f"{req.path}-work"
    argv = (binary, "-F", "-j", "none", "-n", str(workdir), "-f", str(config), "-a", f"{req.host}:{req.port}",
            "-T", "none", "-s", "malloc,64m", "-p", "thread_pools=1")
    return Launch(argv=argv, config=config)

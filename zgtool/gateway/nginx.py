"""nginx as the reference ingress: find the binary, write a config into the run folder
(nothing under /etc is touched), and the argv that runs it in the foreground."""

from __future__ import annotations

import base64
import hashlib
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from zgtool.errors import MissingCapability, UsageError
from zgtool.gateway.admin_deny import ADMIN_DENIED_JSON

NGINX_MODES = ("buffered", "streaming")
INSTALL_HINT = "install it with: sudo apt-get install -y nginx"
NGINX_CANDIDATES = ("/usr/sbin/nginx", "/usr/local/sbin/nginx", "/usr/local/nginx/sbin/nginx")


def find_nginx() -> str:
    """nginx on PATH or the Debian location; a clear message with the install command otherwise."""
    found = shutil.which("nginx") or next((p for p in NGINX_CANDIDATES if os.access(p, os.X_OK)), None)
    if not found:
        raise MissingCapability(f"nginx not found on PATH or in /usr/sbin; {INSTALL_HINT}")
    return found


@dataclass(frozen=True)
class NginxServer:
    """One listening front: `port` proxies to `upstream` (host:port, plaintext HTTP/1.1)."""

    name: str
    port: int
    upstream: str
    mode: str = "streaming"
    host: str = "127.0.0.1"
    tls: bool = False
    basic_auth: bool = False
    deny_admin: bool = True  # False only where the upstream is pygw, which checks admin keys itself

    def __post_init__(self) -> None:
        if self.mode not in NGINX_MODES:
            raise UsageError(f"--nginx-mode must be one of {', '.join(NGINX_MODES)}, not {self.mode!r}")
        if ":" not in self.upstream or "/" in self.upstream:
            raise UsageError(f"nginx upstream must be host:port, not {self.upstream!r}")

    @property
    def url(self) -> str:
        return f"{'https' if self.tls else 'http'}://{self.host}:{self.port}"


def htpasswd_line(user: str, password: str) -> str:
    """A salted-SHA1 entry ({SSHA}), which nginx's auth_basic understands without crypt(3)."""
    if not user or ":" in user:
        raise UsageError("basic-auth user must be non-empty and contain no ':'")
    salt = os.urandom(8)
    digest = hashlib.sha1(password.encode() + salt).digest()
    return f"{user}:{{SSHA}}{base64.b64encode(digest + salt).decode()}\n"


def _server_block(s: NginxServer, run_dir: Path, upstream_name: str) -> str:
    listen = f"listen {s.host}:{s.port}{' ssl' if s.tls else ''};"
    tls = (
        f"        ssl_certificate {run_dir / 'tls' / 'cert.pem'};\n"
        f"        ssl_certificate_key {run_dir / 'tls' / 'key.pem'};\n"
        "        ssl_protocols TLSv1.2 TLSv1.3;\n"
        "        ssl_session_cache shared:zgtls:1m;\n"
        if s.tls
        else ""
    )
    auth = (
        '        auth_basic "zgtool";\n'
        f"        auth_basic_user_file {run_dir / 'htpasswd'};\n"
        # the credential ends here: the upstream sees no Authorization header
        '        proxy_set_header Authorization "";\n'
        if s.basic_auth
        else ""
    )
    if s.mode == "buffered":
        # An ingress as commonly shipped: proxy_buffering on (nginx's default), the
        # upstream's X-Accel-Buffering: no ignored, and gzip for text/JSON responses.
        # Measured on nginx 1.22: proxy_buffering alone still relays SSE per upstream
        # read (event-pipe buffers are flushed); what holds a stream back until the end
        # is the gzip filter, and every SDK sends Accept-Encoding: gzip.
        buffering = (
            "        proxy_buffering on;\n        proxy_ignore_headers X-Accel-Buffering;\n"
            "        gzip on;\n        gzip_proxied any;\n"
            "        gzip_types application/json text/plain text/event-stream;\n"
        )
    else:
        buffering = "        proxy_buffering off;\n        proxy_request_buffering off;\n        proxy_cache off;\n"
    # /admin/* of the engine: never through this public front (nginx holds no keys); operators use
    # the engine's own port. nginx matches locations on the decoded, normalised path (/%61dmin/,
    # //admin/, /x/../admin/ all land here), which is also what the engine routes on.
    admin = (f"""        location ^~ /admin/ {{
            default_type application/json;
            return 403 '{ADMIN_DENIED_JSON}';
        }}
""" if s.deny_admin else "")
    return f"""
    # {s.name}: {s.mode}{', tls' if s.tls else ''}{', basic auth' if s.basic_auth else ''}
    server {{
        {listen}
{tls}        client_max_body_size 32m;
{admin}        location / {{
            proxy_pass http://{upstream_name};
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_set_header Host $http_host;
            proxy_set_header X-Real-IP $remote_addr;
            proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;
            proxy_set_header X-Forwarded-Proto $scheme;
            proxy_connect_timeout 5s;
            # long generations: an SSE stream may stay open for many minutes
            proxy_read_timeout 3600s;
            proxy_send_timeout 3600s;
            # its own hop times (SELF_REPORT_MAPS), after the engine's: a second Server-Timing line
            add_header Server-Timing "${{zg_nginx_upstream_timing}}nginx;dur=$zg_nginx_request_ms" always;
{auth}{buffering}        }}
    }}
"""


# nginx's own hop times as Server-Timing entries (ms, nginx's 1 ms resolution): nginx-upstream-header
# = $upstream_header_time (from nginx starting to connect upstream to the upstream's response
# header) and nginx = $request_time (from the request's first byte to this response's header).
# Both are read when the header goes out, so for a stream they end at its header, not its last
# token; whole-response times ($upstream_response_time) exist only after the body, i.e. in the
# access log or a trailer no client reads. nginx prints seconds ("0.012"): the maps turn them
# into ms, and a request that never reached an upstream gets no upstream entry.
SELF_REPORT_MAPS = r"""
    map $upstream_header_time $zg_nginx_upstream_timing {
        "~^0\.0{0,2}(?<zg_uh_ms>\d+)$" "nginx-upstream-header;dur=$zg_uh_ms, ";
        "~^(?<zg_uh_s>[1-9]\d*)\.(?<zg_uh_sms>\d{3})$" "nginx-upstream-header;dur=$zg_uh_s$zg_uh_sms, ";
        default "";
    }
    map $request_time $zg_nginx_request_ms {
        "~^0\.0{0,2}(?<zg_rt_ms>\d+)$" "$zg_rt_ms";
        "~^(?<zg_rt_s>[1-9]\d*)\.(?<zg_rt_sms>\d{3})$" "$zg_rt_s$zg_rt_sms";
        default "0";
    }
"""


def render_config(servers: list[NginxServer], run_dir: Path, *, workers: int = 1) -> str:
    """The whole nginx.conf; every path (pid, logs, temp) lives inside run_dir."""
    if not servers:
        raise UsageError("nginx needs at least one server to front")
    upstreams: dict[str, str] = {}
    for s in servers:
        upstreams.setdefault(s.upstream, f"zg_up_{len(upstreams)}")
    user = "user root;\n" if os.geteuid() == 0 else ""  # workers must write the run-folder temp paths
    tmp = run_dir / "nginx-tmp"
    ups = "".join(
        f"""
    upstream {name} {{
        server {addr};
        keepalive 64;
        keepalive_requests 100000;
        keepalive_timeout 60s;
    }}
"""
        for addr, name in upstreams.items()
    )
    blocks = "".join(_server_block(s, run_dir, upstreams[s.upstream]) for s in servers)
    return f"""# generated by zgtool; run with: nginx -p {run_dir} -c {run_dir / 'nginx.conf'} -g 'daemon off;'
{user}worker_processes {workers};
pid {run_dir / 'nginx.pid'};
error_log {run_dir / 'nginx-error.log'} warn;

events {{
    worker_connections 4096;
}}

http {{
    # combined plus the timings `--dataset access-log:nginx:` and `latency-split --from-log` read
    # (zgtool.workload.accesslog), and the W3C traceparent zgtool sends, so a line joins its request
    log_format zgtool_timed '$remote_addr - $remote_user [$time_local] "$request" $status $body_bytes_sent '
                            '"$http_referer" "$http_user_agent" $request_time $upstream_response_time '
                            '$request_length "$http_traceparent"';
    access_log {run_dir / 'nginx-access.log'} zgtool_timed;
    client_body_temp_path {tmp / 'client_body'};
    proxy_temp_path {tmp / 'proxy'};
    fastcgi_temp_path {tmp / 'fastcgi'};
    uwsgi_temp_path {tmp / 'uwsgi'};
    scgi_temp_path {tmp / 'scgi'};
    default_type application/octet-stream;
    sendfile on;
    tcp_nodelay on;
    keepalive_timeout 65s;
    keepalive_requests 100000;
{SELF_REPORT_MAPS}{ups}{blocks}}}
"""


def write_config(
    servers: list[NginxServer],
    run_dir: Path,
    *,
    workers: int = 1,
    basic_auth: tuple[str, str] | None = None,
) -> Path:
    """Write nginx.conf (+ htpasswd, TLS files) into run_dir; returns the config path."""
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "nginx-tmp").mkdir(exist_ok=True)
    if any(s.basic_auth for s in servers):
        if basic_auth is None:
            raise UsageError("basic auth at nginx needs a user and password")
        (run_dir / "htpasswd").write_text(htpasswd_line(*basic_auth))
    if any(s.tls for s in servers):
        from zgtool.gateway.tls import write_self_signed

        write_self_signed(run_dir / "tls", hosts=sorted({s.host for s in servers}))
    conf = run_dir / "nginx.conf"
    conf.write_text(render_config(servers, run_dir, workers=workers))
    return conf


def nginx_argv(binary: str, run_dir: Path) -> list[str]:
    return [binary, "-p", str(run_dir), "-c", str(run_dir / "nginx.conf"), "-g", "daemon off;"]

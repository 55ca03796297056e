"""Squid (Debian 5.7) as a reverse proxy (accelerator mode, caching off), `squid -N` in the
foreground with its logs and pid in the run folder.

Started as root, Squid drops to its `proxy` user before it opens its logs, so they go to a
`squid` folder owned by that user; when the run folder's parents are closed to other users
(pytest's temp folders are 0700) the access log is off and the cache log goes to stderr,
which is the child's log file."""

from __future__ import annotations

import contextlib
import os
import pwd
import stat
from pathlib import Path

from zgtool.gateway.admin_deny import ADMIN_DENIED_JSON, ADMIN_RAW_PATH_RE
from zgtool.gateway.binaries import find_binary
from zgtool.gateway.catalog import Launch, LaunchRequest, render_template

INSTALL = "sudo apt-get install -y squid"
SQUID_USER = "proxy"  # Debian's cache_effective_user


def _open_to_others(path: Path) -> bool:
    """Every folder from / down to path lets other users through (o+x)."""
    return all(p.stat().st_mode & stat.S_IXOTH for p in (path, *path.parents))


def _log_dir(run_dir: Path) -> Path | None:
    """Where Squid can write its logs, or None (logs to stderr, access log off)."""
    if os.geteuid() != 0:
        return run_dir
    try:
        user = pwd.getpwnam(SQUID_USER)
    except KeyError:
        return None
    if not _open_to_others(run_dir.resolve()):
        return None
    folder = run_dir / "squid"
    folder.mkdir(exist_ok=True)
    os.chown(folder, user.pw_uid, user.pw_gid)
    return folder


def _drop_stale_segments(service: str, shm: Path = Path("/dev/shm")) -> None:
    """Squid 5.7 leaves its shared-memory segments behind when it stops; a later Squid with the
    same service name (same port) would then die with shm_open ... File exists. The port is
    free now, so no live Squid owns them."""
    for seg in shm.glob(f"{service}-*.shm"):
        with contextlib.suppress(OSError):
            seg.unlink()


def launch(req: LaunchRequest) -> Launch:
    binary = find_binary("squid", INSTALL)
    up_host, up_port = req.upstream_host_port
    config = req.run_dir / f"{req.path}.conf"
    folder = _log_dir(req.run_dir)
    if folder is None:
        logs = ("# the run folder is closed to Squid's user: cache log on stderr, no access log\n"
                "access_log none\ncache_log /dev/null\npid_filename none\n")
        files: tuple[Path, ...] = ()
    else:
        files = (folder / "access.log", folder / "cache.log")
        logs = (f"access_log stdio:{files[0]}\ncache_log {files[1]}\npid_filename {folder / 'squid.pid'}\n"
                f"coredump_dir {folder}\n")
    config.write_text(render_template(
        "squid.conf.tmpl", admin_json=ADMIN_DENIED_JSON, admin_re=ADMIN_RAW_PATH_RE, config=config, host=req.host, port=req.port, upstream_host=up_host,
        upstream_port=up_port, logs=logs,
    ))
    # its own service name: shared-memory segments (/dev/shm/<name>-*) of two Squids never collide
    service = f"zgsquid{req.port}"
    _drop_stale_segments(service)
    argv = (binary, "-N", "-d", "1", "-n", service, "-f", str(config))
    return Launch(argv=argv, config=config, logs=files)

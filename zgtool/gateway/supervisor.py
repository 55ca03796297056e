"""LocalStack: the engine plus the reference gateway paths (nginx, pygw, nginx -> pygw),
each a supervised child on its own port, all stopped on exit, exception or signal.

    with LocalStack(StackConfig(model="null", paths=("nginx", "pygw", "stack"))) as st:
        st.urls  # {"direct": ..., "nginx": ..., "pygw": ..., "stack": ...}
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from zgtool.errors import UsageError
from zgtool.gateway.catalog import GATEWAY_KINDS, LAUNCHED, PATHS, path_for
from zgtool.gateway.nginx import NGINX_MODES, NginxServer, find_nginx, nginx_argv, write_config
from zgtool.gateway.procs import Child, free_port, http_ok, wait_ready
from zgtool.gateway.stack_keys import INTERNAL_KEY_ENV
from zgtool.http.net import port_in_use

GATEWAYS = ("none", *GATEWAY_KINDS)


class StartFailed(UsageError):
    """A child did not come up; the message names the part and its log."""


@dataclass(frozen=True)
class StackConfig:
    model: str = "null"
    paths: tuple[str, ...] = ("nginx", "pygw", "stack")
    nginx_mode: str = "streaming"            # mode of the "nginx" and "stack" fronts
    host: str = "127.0.0.1"
    upstream: str | None = None              # front an existing server instead of starting an engine
    engine_port: int | None = None
    gateway_port: int | None = None          # front of the first gateway path in `paths`
    engine_args: tuple[str, ...] = ()        # extra `zgtool serve` flags (--tls, --keys, ...)
    tls: bool = False                        # TLS termination at every nginx front (self-signed)
    basic_auth: tuple[str, str] | None = None  # (user, password) checked by nginx
    pygw_keys: Path | None = None
    pygw_policy: str = "default"
    pygw_args: tuple[str, ...] = ()
    redis_url: str | None = None
    gateway_model: str | None = None         # the model name clients send (LiteLLM's model_list)
    forward_traceparent: bool = False        # LiteLLM passes the client's traceparent on (zgtool.gateway.litellm)
    otlp_traces_endpoint: str | None = None  # LiteLLM exports its own spans there (zgtool.gateway.litellm)
    nginx_workers: int = 1                   # one worker: like for like with the one-process engine
    run_dir: Path | None = None              # None: a temp folder, removed after a clean stop
    start_timeout_s: float = 180.0
    stop_grace_s: float = 5.0

    def __post_init__(self) -> None:
        bad = [p for p in self.paths if p not in PATHS]
        if bad:
            raise UsageError(f"unknown gateway path {bad[0]!r}; choose from {', '.join(PATHS)}")
        if self.nginx_mode not in NGINX_MODES:
            raise UsageError(f"--nginx-mode must be one of {', '.join(NGINX_MODES)}, not {self.nginx_mode!r}")
        if (self.tls or self.basic_auth) and not self.nginx_fronts:
            raise UsageError("TLS termination and basic auth are done by nginx: choose an nginx or stack path")
        if self.upstream is not None:
            from zgtool.targets import validate_url

            validate_url(self.upstream)
        if self.forward_traceparent and "litellm" not in self.paths:
            raise UsageError("--forward-traceparent is LiteLLM's: it drops the client's traceparent unless told; "
                             "nginx, HAProxy, Caddy, Varnish, Squid and pygw pass it on as it is")
        if self.otlp_traces_endpoint is not None:
            from zgtool.targets import validate_url

            if "litellm" not in self.paths:
                raise UsageError("--otlp-traces-endpoint exports LiteLLM's own spans; the other gateways zgtool "
                                 "starts export none")
            validate_url(self.otlp_traces_endpoint)
        for port in (self.engine_port, self.gateway_port):
            if port is not None and not 0 < port < 65536:
                raise UsageError(f"port must be 1..65535, not {port}")

    @property
    def nginx_fronts(self) -> list[str]:
        return [p for p in self.paths if p in ("nginx", "nginx-buffered", "stack")]

    @property
    def needs_pygw(self) -> bool:
        return "pygw" in self.paths or "stack" in self.paths

    @classmethod
    def for_gateway(cls, gateway: str, **kw: Any) -> StackConfig:
        """`zgtool serve --gateway G` / `zgtool gateway --kind G` -> the paths to run."""
        if gateway not in GATEWAYS:
            raise UsageError(f"--gateway must be one of {', '.join(GATEWAYS)}, not {gateway!r}")
        if gateway == "none":
            return cls(paths=(), **kw)
        # --nginx-mode/--buffering buffered: haproxy and caddy run their buffered configuration
        mode = kw.get("nginx_mode", "streaming")
        path = path_for(gateway, mode) if gateway in ("haproxy", "caddy") else gateway
        return cls(paths=(path,), **kw)


@dataclass
class LocalStack:
    config: StackConfig
    urls: dict[str, str] = field(default_factory=dict, init=False)
    children: list[Child] = field(default_factory=list, init=False)
    run_dir: Path = field(default=Path(), init=False)
    _own_run_dir: bool = field(default=False, init=False)
    _failed: bool = field(default=False, init=False)
    _prev_sigterm: Any = field(default=None, init=False)

    @property
    def pids(self) -> list[int]:
        return [c.pid for c in self.children if c.pid is not None]

    def logs(self) -> dict[str, Path]:
        return {c.name: c.log_path for c in self.children}

    def __enter__(self) -> LocalStack:
        cfg = self.config
        if cfg.run_dir is None:
            self.run_dir, self._own_run_dir = Path(tempfile.mkdtemp(prefix="zgtool-stack-")), True
        else:
            self.run_dir = cfg.run_dir.resolve()
            self.run_dir.mkdir(parents=True, exist_ok=True)
        self._install_sigterm()
        try:
            self._start_all()
        except BaseException:
            self._failed = True
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        if threading.current_thread() is threading.main_thread() and self._prev_sigterm is not None:
            signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a second SIGTERM must not cut the drain short
        drain(self.children, self.config.stop_grace_s)
        if threading.current_thread() is threading.main_thread() and self._prev_sigterm is not None:
            signal.signal(signal.SIGTERM, self._prev_sigterm)
            self._prev_sigterm = None
        if self._own_run_dir and not self._failed and exc[0] is None:
            shutil.rmtree(self.run_dir, ignore_errors=True)

    def _install_sigterm(self) -> None:
        # SIGTERM takes the same road as Ctrl-C: unwinding through __exit__ stops every child
        if threading.current_thread() is not threading.main_thread():
            return

        def on_term(signum: int, frame: Any) -> None:
            raise KeyboardInterrupt

        self._prev_sigterm = signal.signal(signal.SIGTERM, on_term)

    def _spawn(self, name: str, argv: list[str], ready_url: str, *, any_status: bool = False,
               extra_env: dict[str, str] | None = None) -> None:
        env = {**os.environ, "PYTHONUNBUFFERED": "1", **(extra_env or {})}
        child = Child(name, argv, self.run_dir / f"{name}.log", env=env)
        self.children.append(child)
        try:
            child.start()
        except OSError as exc:
            raise StartFailed(f"{name} could not be started ({exc}); see {child.log_path}") from exc
        probe = _responds(ready_url) if any_status else http_ok(ready_url, auth=self.config.basic_auth)
        why = wait_ready(child, probe, timeout_s=self.config.start_timeout_s)
        if why is not None:
            tail = child.log_tail()
            raise StartFailed(f"{name} failed to start: {why}; log {child.log_path}" + (f": {tail}" if tail else ""))

    def _start_all(self) -> None:
        cfg = self.config
        host = cfg.host
        taken: set[int] = set()

        def port(wanted: int | None = None) -> int:
            if wanted and port_in_use(host, wanted):
                # another server there would answer our readiness check, and the child would die unseen
                raise UsageError(f"port {wanted} on {host} is already in use by another process: choose another "
                                 "port or stop what listens there")
            try:
                p = wanted or free_port(host)
            except OSError as exc:
                raise UsageError(f"cannot listen on {host}: {exc.strerror or exc}") from None
            while p in taken:
                p = free_port(host)
            taken.add(p)
            return p

        front_ports: dict[str, int] = {}

        def front_port(path: str) -> int:
            # chosen right before its server starts (not minutes earlier, before a model loads):
            # a port picked early can be taken by another process, whose answers would pass
            # our readiness check; the first path listed gets --gateway-port
            if path not in front_ports:
                front_ports[path] = port(cfg.gateway_port if path == cfg.paths[0] else None)
            return front_ports[path]

        pygw_env: dict[str, str] = {}
        if cfg.upstream:
            upstream = cfg.upstream.rstrip("/")
        else:
            engine_port = port(cfg.engine_port)
            upstream = f"http://{host}:{engine_port}"
            # the app's own entry point (what the console script runs), not a module path
            # that depends on how zgtool/cli.py is wired
            argv = [sys.executable, "-m", "zgtool", "serve", "--model", cfg.model,
                    "--host", host, "--port", str(engine_port), *cfg.engine_args]
            if "--grace-s" not in cfg.engine_args:
                argv += ["--grace-s", f"{cfg.stop_grace_s:g}"]
            engine_keys = None
            if cfg.pygw_keys and cfg.needs_pygw and "--keys" not in cfg.engine_args and "litellm" not in cfg.paths:
                # a keyed pygw must not leave the engine port open (zgtool.gateway.stack_keys)
                from zgtool.gateway.stack_keys import write_engine_keys

                engine_keys, pygw_env[INTERNAL_KEY_ENV] = write_engine_keys(cfg.pygw_keys, self.run_dir)
                argv += ["--keys", str(engine_keys)]
            try:
                self._spawn("engine", argv, upstream + "/health")
            finally:
                if engine_keys is not None:  # read at start-up; it holds the admin keys
                    engine_keys.unlink(missing_ok=True)
        self.urls["direct"] = upstream

        pygw_port = 0
        if cfg.needs_pygw:
            pygw_port = front_port("pygw") if "pygw" in cfg.paths else port()
            argv = [sys.executable, "-m", "zgtool.gateway.pygw_main", "--upstream", upstream, "--host", host,
                    "--port", str(pygw_port), "--policy", cfg.pygw_policy, *cfg.pygw_args]
            if cfg.pygw_keys:
                argv += ["--keys", str(cfg.pygw_keys)]
            if cfg.redis_url:
                argv += ["--redis", cfg.redis_url]
            if pygw_env:
                argv += ["--upstream-key-env", INTERNAL_KEY_ENV]
            if "--grace-s" not in cfg.pygw_args:
                argv += ["--grace-s", f"{cfg.stop_grace_s:g}"]
            if "--max-body-bytes" in cfg.engine_args and "--max-body-bytes" not in cfg.pygw_args:
                argv += ["--max-body-bytes", cfg.engine_args[cfg.engine_args.index("--max-body-bytes") + 1]]
            pygw_url = f"http://{host}:{pygw_port}"
            self._spawn("pygw", argv, pygw_url + "/health", extra_env=pygw_env)
            if "pygw" in cfg.paths:
                self.urls["pygw"] = pygw_url
        for path in cfg.paths:
            if path in LAUNCHED:
                self._start_launched(path, front_port(path), upstream)
        servers = []
        up_addr = upstream.split("://", 1)[1].split("/", 1)[0]
        for path in cfg.nginx_fronts:
            mode = "buffered" if path == "nginx-buffered" else cfg.nginx_mode
            target = f"{host}:{pygw_port}" if path == "stack" else up_addr
            servers.append(NginxServer(path, front_port(path), target, mode, host, cfg.tls, bool(cfg.basic_auth),
                                       deny_admin=path != "stack"))
        if servers:
            if cfg.upstream and cfg.upstream.startswith("https://"):
                raise UsageError("nginx fronts a plaintext upstream; give an http:// upstream URL")
            binary = find_nginx()
            write_config(servers, self.run_dir, workers=cfg.nginx_workers, basic_auth=cfg.basic_auth)
            first = servers[0]
            self._spawn("nginx", nginx_argv(binary, self.run_dir), first.url + "/", any_status=True)
            for s in servers:
                self.urls[s.name] = s.url
                if s is not first:
                    ready = _responds(s.url + "/")
                    if wait_ready(self.children[-1], ready, timeout_s=10) is not None:
                        raise StartFailed(f"nginx is not answering on {s.url}; log {self.run_dir / 'nginx-error.log'}")

    def _start_launched(self, path: str, port: int, upstream: str) -> None:
        """haproxy, caddy, varnish, squid, litellm: config from zgtool.gateway.catalog, one child each."""
        from zgtool.gateway.catalog import LaunchRequest, plan_launch

        cfg = self.config
        req = LaunchRequest(path=path, host=cfg.host, port=port, upstream=upstream, run_dir=self.run_dir,
                            keys_file=cfg.pygw_keys, redis_url=cfg.redis_url,
                            # the engine started here serves cfg.model; an upstream's own models are asked
                            model=cfg.gateway_model or (None if cfg.upstream else cfg.model),
                            forward_traceparent=cfg.forward_traceparent,
                            otlp_traces_endpoint=cfg.otlp_traces_endpoint)
        launch = plan_launch(req)
        url = f"http://{cfg.host}:{port}"
        self._spawn(path, list(launch.argv), url + launch.ready_path, any_status=launch.ready_any_status,
                    extra_env=launch.env)
        self.urls[path] = url


# How each kind of child is asked to drain: stop accepting, finish what is in flight.
_DRAIN_SIGNAL = {"nginx": signal.SIGQUIT, "haproxy": signal.SIGUSR1}


def drain(children: list[Child], grace_s: float, *, margin_s: float = 5.0) -> None:
    """Stop the stack front first, engine last, within one grace period.

    Each child in reverse start order (the fronts, pygw, the engine) is asked to drain
    (nginx SIGQUIT: graceful; the others SIGTERM) and waited for until the deadline
    before the next one is asked, so a request a front has accepted always finds its
    upstream running. A child still busy at the deadline is left running while the next
    ones stop; pygw then gets a second SIGTERM, ending its streams with an error event
    (which the fronts relay). The engine drains its own clients within its --grace-s.
    Whatever is left after `margin_s` more is killed with its process group."""
    deadline = time.monotonic() + grace_s
    order = list(reversed(list(children)))
    for i, child in enumerate(order):
        if child.proc is None or not child.is_alive():
            continue
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(child.proc.pid, _DRAIN_SIGNAL.get(child.name, signal.SIGTERM))
        last = i == len(order) - 1
        until = time.monotonic() + grace_s + margin_s if last else deadline
        _wait_exit(child, until)
        if child.name == "pygw" and child.is_alive():  # past grace: end its streams now
            _wait_exit(child, time.monotonic() + 0.2)  # two quick SIGTERMs could arrive as one
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(child.proc.pid, signal.SIGTERM)
            _wait_exit(child, time.monotonic() + margin_s)
    end = time.monotonic() + margin_s
    for child in order:
        _wait_exit(child, end)
        child.stop(grace_s=1.0)  # reap; SIGKILL the group if anything is left


def _wait_exit(child: Child, until: float) -> None:
    proc = child.proc
    if proc is None:
        return
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=max(0.0, until - time.monotonic()))


def _responds(url: str):
    """Ready when anything HTTP answers (nginx in front of a user's upstream may 404 or 502)."""

    def probe() -> bool:
        import httpx

        httpx.get(url, timeout=2.0, verify=False)
        return True

    return probe


def watch(stack: LocalStack, poll_s: float = 0.5) -> None:
    """Block until Ctrl-C/SIGTERM (returns) or a child dies (raises, naming it and its log)."""
    try:
        while True:
            for c in stack.children:
                code = c.exit_code()
                if code is not None:
                    tail = c.log_tail()
                    raise UsageError(f"{c.name} exited with code {code}; log {c.log_path}" + (f": {tail}" if tail else ""))
            time.sleep(poll_s)
    except KeyboardInterrupt:
        return


def serve_with_gateway(config: StackConfig, *, console: Any = None) -> None:
    """What `zgtool serve --gateway ...` and `zgtool gateway ...` run: start, print the
    endpoint table, block until interrupted, stop every child."""
    from zgtool.gateway.render import print_endpoints

    if config.run_dir is None:
        stamp = time.strftime("%Y%m%d-%H%M%S")
        kind = "gateway" if config.upstream else "serve"
        config = _replace(config, run_dir=Path("runs") / f"{kind}-{stamp}-{os.getpid()}")
    try:
        with LocalStack(config) as st:
            print_endpoints(st, console=console)
            sys.stdout.flush()  # piped output (tee, a log collector) must see the table now
            watch(st)
    except KeyboardInterrupt:  # Ctrl-C during start-up: children are already stopped
        pass


def _replace(cfg: StackConfig, **kw: Any) -> StackConfig:
    import dataclasses

    return dataclasses.replace(cfg, **kw)

"""Command line of the pygw process (`python -m zgtool.gateway.pygw_main ...`): parse, validate
with one-line errors, then run uvicorn (httptools + uvloop, one process)."""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path
from typing import Any

from zgtool.errors import ExitCode, TargetUnreachable, UsageError, exit_code_for, user_message


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m zgtool.gateway.pygw_main", description="zgtool's Python AI gateway")
    p.add_argument("--upstream", required=True, help="base URL of the upstream (Anthropic Messages API)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--redis", default=None, help="redis://host:port/db: share limits and cache between gateways")
    p.add_argument("--keys", type=Path, default=None, help="virtual keys TOML (open gateway when absent)")
    p.add_argument("--policy", default="default", help="moderation policy: a TOML file, 'default' or 'none'")
    p.add_argument("--cache-ttl", type=float, default=300.0, help="seconds a cached answer lives")
    p.add_argument("--rpm", type=float, default=600_000, help="requests/minute per key when no keys file sets one")
    p.add_argument("--burst", type=int, default=10_000, help="token-bucket size per key when no keys file sets one")
    p.add_argument("--max-retries", "--retries", dest="max_retries", type=int, default=0,
                   help="retry 502/503/504/529 (retry-after honoured) and failed connects; never 500 or 429; "
                        "default off. Retries made: x-gateway-retries and pygw_upstream_retries_total")
    p.add_argument("--max-connections", type=int, default=256, help="upstream connection pool size")
    p.add_argument("--max-body-bytes", type=int, default=8 * 1024 * 1024,
                   help="largest request body accepted (413 above; default: the engine's own limit)")
    p.add_argument("--grace-s", type=float, default=5.0,
                   help="on SIGTERM, let in-flight requests finish this long; then streams end with an error event")
    p.add_argument("--upstream-key-env", default=None,
                   help="env var holding the key sent upstream (overrides the keys file's [upstream] api_key_env)")
    p.add_argument("--log-level", default="warning")
    return p


def build_config(argv: list[str] | None = None):  # -> (GatewayConfig, host, port, log_level)
    from zgtool.gateway.policy import load_keys, load_policy
    from zgtool.gateway.pygw import GatewayConfig
    from zgtool.targets import validate_url

    args = build_parser().parse_args(argv)
    validate_url(args.upstream)
    if not 0 < args.port < 65536:
        raise UsageError(f"--port must be 1..65535, not {args.port}")
    if args.max_retries < 0 or args.cache_ttl <= 0:
        raise UsageError("--max-retries must be >= 0 and --cache-ttl > 0")
    if args.max_body_bytes < 1024 or args.grace_s < 0:
        raise UsageError("--max-body-bytes must be >= 1024 and --grace-s >= 0")
    if args.redis:
        _check_redis(args.redis)
    cfg = GatewayConfig(
        upstream=args.upstream.rstrip("/"),
        keys=load_keys(args.keys, rpm=args.rpm, burst=args.burst, upstream_key_env=args.upstream_key_env),
        policy=load_policy(args.policy),
        redis_url=args.redis,
        cache_ttl_s=args.cache_ttl,
        max_retries=args.max_retries,
        max_connections=args.max_connections,
        max_body_bytes=args.max_body_bytes,
        grace_s=args.grace_s,
    )
    return cfg, args.host, args.port, args.log_level


def _check_redis(url: str) -> None:
    """Fail at start with one line, not on the first request."""
    from zgtool.extras import REDIS_MODULES, require_extra

    require_extra("gateway --redis", "engine", REDIS_MODULES)
    import redis

    try:
        client = redis.Redis.from_url(url, socket_connect_timeout=3)
        client.ping()
        client.close()
    except ValueError as exc:
        raise UsageError(f"--redis {url!r} is not a redis URL: {exc}") from exc
    except redis.RedisError as exc:
        raise TargetUnreachable(f"cannot reach redis at {url}: {exc}") from exc


def _server(config: Any, gateway: Any) -> Any:
    """uvicorn.Server with pygw's drain: SIGTERM/SIGINT stop accepting and let requests run
    up to --grace-s (uvicorn then cancels what is left, and pygw ends each stream with an
    error event); a second signal ends the remaining requests that way at once."""
    import uvicorn

    class DrainingServer(uvicorn.Server):
        def handle_exit(self, sig: int, frame: Any) -> None:
            if self.should_exit:
                if gateway.loop is not None:
                    gateway.loop.call_soon_threadsafe(gateway.abort_requests)
                return
            gateway.draining = True
            super().handle_exit(sig, frame)

    return DrainingServer(config)


def main(argv: list[str] | None = None) -> None:
    import logging

    try:
        cfg, host, port, log_level = build_config(argv)
    except Exception as exc:  # a ZgError or the HTTP kit's ConfigError (a bad keys file): one line
        message = user_message(exc)
        if message is None:
            raise
        print(f"pygw: {message}", file=sys.stderr)
        sys.exit(int(exit_code_for(exc)))
    import uvicorn

    from zgtool.gateway.pygw import Gateway
    from zgtool.gateway.pygw_protocol import PygwProtocol

    logging.basicConfig(level=log_level.upper(), format="%(asctime)s pygw %(levelname)s %(message)s")
    print(f"pygw: listening on http://{host}:{port} -> {cfg.upstream}"
          f" (keys: {'open' if cfg.keys.open else len(cfg.keys.keys)}, redis: {cfg.redis_url or 'off'},"
          f" moderation rules: {len(cfg.policy.rules)})", file=sys.stderr, flush=True)
    gateway = Gateway(cfg)
    config = uvicorn.Config(
        gateway, host=host, port=port, loop="uvloop", http=PygwProtocol, lifespan="on",
        access_log=False, log_level=log_level, timeout_keep_alive=65,
        timeout_graceful_shutdown=max(1, math.ceil(cfg.grace_s)),
    )
    try:
        _server(config, gateway).run()
    except KeyboardInterrupt:
        pass
    except OSError as exc:
        print(f"pygw: cannot listen on {host}:{port}: {exc}", file=sys.stderr)
        sys.exit(int(ExitCode.USAGE))


if __name__ == "__main__":
    main()

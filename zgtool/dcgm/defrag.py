"""Client side of `zgtool defrag`: the engine's admin endpoints, errors mapped once.

    GET  /admin/kv                                     -> KV pool / allocator report
    POST /admin/defrag {"dry_run", "drop_prefix_cache"} -> {"before", "after", "actions", ...}

The admin key goes in `x-api-key` (docs/CONTRACTS.md); it is never written to results. A gateway in
front of the engine never serves /admin/*: pointed at one, defrag says it is a gateway (the `Via`
evidence) and names the engine's own address where the gateway tells it (exit 3), since no key can help.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from zgtool.errors import MissingCapability, TargetUnreachable, UsageError
from zgtool.gateway.admin_deny import ADMIN_DENIED_MESSAGE
from zgtool.targets import validate_url
from zgtool.tlsverify import CERT_HINT, is_cert_failure

ADMIN_KEY_ENV = "ZGTOOL_ADMIN_KEY"
ADMIN_DENIED = ADMIN_DENIED_MESSAGE.split(";")[0]   # "/admin/* is not served through this gateway"


class GatewayNotEngine(TargetUnreachable):
    """The URL is a gateway in front of the engine: its admin endpoints are not reachable there (exit 3)."""


@dataclass(frozen=True)
class DefragRequest:
    engine_url: str
    dry_run: bool = False
    drop_prefix_cache: bool = False
    admin_key: str | None = None
    timeout_s: float = 60.0  # compaction copies KV between steps; give it time
    verify: bool | str = True  # TLS: system CAs, False (--insecure) or a CA bundle (--cacert)

    def __post_init__(self) -> None:
        validate_url(self.engine_url)
        if self.timeout_s <= 0:
            raise UsageError("--timeout must be > 0 seconds")


class AdminClient:
    def __init__(self, base_url: str, admin_key: str | None, timeout_s: float, verify: bool | str = True) -> None:
        import httpx  # lazy: CLI start-up stays light

        self.base_url = base_url.rstrip("/")
        headers = {"x-api-key": admin_key} if admin_key else {}
        self._client = httpx.Client(base_url=self.base_url, headers=headers, timeout=timeout_s, verify=verify)
        self._has_key = bool(admin_key)

    def close(self) -> None:
        self._client.close()

    def __enter__(self) -> AdminClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def kv(self) -> dict[str, Any]:
        return self._call("GET", "/admin/kv")

    def defrag(self, dry_run: bool, drop_prefix_cache: bool) -> dict[str, Any]:
        return self._call("POST", "/admin/defrag", json={"dry_run": dry_run, "drop_prefix_cache": drop_prefix_cache})

    def _call(self, method: str, path: str, **kw: Any) -> dict[str, Any]:
        import httpx

        url = self.base_url + path
        try:
            resp = self._client.request(method, path, **kw)
        except httpx.TimeoutException as exc:
            raise TargetUnreachable(f"engine {url} timed out: {exc}") from exc
        except httpx.HTTPError as exc:
            if is_cert_failure(exc):
                raise TargetUnreachable(f"{self.base_url}: the TLS certificate did not verify; {CERT_HINT}") from exc
            raise TargetUnreachable(f"cannot reach the engine at {self.base_url}: {exc}") from exc
        detail = _error_message(resp)
        if resp.status_code in (401, 403, 404) and _is_gateway_answer(resp, detail):
            raise _gateway_error(self, resp, detail)
        if resp.status_code in (401, 403):
            if self._has_key:
                raise UsageError(f"the engine refused the admin key (HTTP {resp.status_code}: {detail}); "
                                 f"check --admin-key / {ADMIN_KEY_ENV}")
            raise UsageError(f"the engine requires an admin key (HTTP {resp.status_code}: {detail}); "
                             f"pass --admin-key KEY or set {ADMIN_KEY_ENV}")
        if resp.status_code == 404:
            raise MissingCapability(f"{url} not found (HTTP 404): this server has no zgtool admin endpoints")
        if resp.status_code >= 500:
            raise TargetUnreachable(f"the engine failed {method} {path} (HTTP {resp.status_code}: {detail})")
        if resp.status_code >= 400:
            raise UsageError(f"the engine rejected {method} {path} (HTTP {resp.status_code}: {detail})")
        try:
            body = resp.json()
        except ValueError as exc:
            raise TargetUnreachable(f"{url} answered without JSON; is this a zgtool engine?") from exc
        if not isinstance(body, dict):
            raise TargetUnreachable(f"{url} answered {type(body).__name__}, expected a JSON object")
        return body


def _gateway_error(client: AdminClient, resp: Any, detail: str) -> GatewayNotEngine:
    """Name the gateway's evidence and, where a proxied answer names it, the engine behind it."""
    import httpx

    evidence = [f"Via: {resp.headers['via']}"] if resp.headers.get("via") else []
    if ADMIN_DENIED in detail:
        evidence.append(f"/admin/* refused with HTTP {resp.status_code}: {detail!r}")
    backend = None
    try:   # a proxied answer says which upstream it came from (pygw: x-backend-server)
        probe = client._client.get("/v1/models")
        backend = probe.headers.get("x-backend-server")
        if probe.headers.get("via") and not resp.headers.get("via"):
            evidence.insert(0, f"Via: {probe.headers['via']} (on GET /v1/models)")
    except httpx.HTTPError:
        pass
    where = (f"the engine behind it answers at {backend} (x-backend-server): run zgtool defrag --engine "
             f"http://{backend}" if backend else
             "run zgtool defrag --engine on the engine's own port (`zgtool serve --gateway` prints it as "
             "'direct')")
    return GatewayNotEngine(f"{client.base_url} is a gateway, not the engine ({'; '.join(evidence)}): a gateway "
                            f"never serves the engine's /admin/* endpoints, so no admin key can help; {where}")


def _is_gateway_answer(resp: Any, detail: str) -> bool:
    return bool(resp.headers.get("via")) or ADMIN_DENIED in detail


def _error_message(resp: Any) -> str:
    """The message from the engine's error shape {"type":"error","error":{"message":...}}."""
    try:
        body = resp.json()
    except ValueError:
        return (resp.text or resp.reason_phrase or "").strip()[:200]
    if isinstance(body, dict):
        err = body.get("error")
        if isinstance(err, dict) and err.get("message"):
            return str(err["message"])
        if isinstance(err, str):
            return err
        if body.get("message"):
            return str(body["message"])
    return str(body)[:200]


def run_defrag(req: DefragRequest) -> dict[str, Any]:
    """Ask the engine to defrag (or dry-run) and return the "defrag" result payload."""
    with AdminClient(req.engine_url, req.admin_key, req.timeout_s, req.verify) as client:
        before_kv = client.kv()  # also checks reachability and the key before acting
        resp = client.defrag(req.dry_run, req.drop_prefix_cache)
        before = resp.get("before")
        after = resp.get("after")
        if before is None:
            before = before_kv
        if after is None:
            after = client.kv()
    extra = {k: v for k, v in resp.items() if k not in ("before", "after", "actions", "dry_run")}
    return {
        "engine": req.engine_url,
        "dry_run": req.dry_run,
        "drop_prefix_cache": req.drop_prefix_cache,
        "before": before,
        "after": after,
        "actions": resp.get("actions", []),
        **extra,
    }

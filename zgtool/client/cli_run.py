"""The logic behind `zgtool client ask`, kept out of the Typer wiring."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from zgtool.client.retry import NEVER_RETRIED_STATUSES
from zgtool.errors import MissingCapability, TargetUnreachable, UsageError


@dataclass(frozen=True)
class AskOptions:
    target: str
    prompt: str
    stream: bool = False
    fallback: tuple[str, ...] = ()
    model: str | None = None
    api: str | None = None
    system: str | None = None
    max_tokens: int = 64
    timeout_s: float = 60.0
    max_attempts: int = 4
    max_wait_s: float = 60.0
    util_threshold_pct: float = 95.0
    fallback_after: int = 3
    idempotent: bool = True
    config: Path | None = None
    as_json: bool = False
    out: Path | None = None
    verify: bool | str = True  # TLS: system CAs, False (--insecure) or a CA bundle path (--cacert)
    headers: Mapping[str, str] = field(default_factory=dict)   # -H: on every attempt (secret)


DETECT_TIMEOUT_S = 10.0


def _detected(opts: AskOptions, target: Any) -> tuple[Any, str | None]:
    """A bare URL without --model: the model it lists (zgtool.latency.wire.detect.listed_model, GET /v1/models
    only: no request that would change what the server answers the ask), so that `ask http://vllm:8000` asks
    for the model vLLM serves, not "default"; how it was found, for stderr."""
    if "://" not in opts.target or opts.model is not None:
        return target, None
    from dataclasses import replace

    from zgtool.latency.wire.detect import listed_model

    found = listed_model(target, timeout_s=min(opts.timeout_s, DETECT_TIMEOUT_S), verify=opts.verify)
    if found is None:
        return target, None
    return replace(target, model=found[0]), f"model {found[0]!r} ({found[1]}); --model overrides"


def run_ask(opts: AskOptions) -> None:
    from zgtool.client.client import Client, RequestFailed
    from zgtool.client.policy import AutoFallbackPolicy, FallbackConfig
    from zgtool.client.render import render, result_data
    from zgtool.client.retry import RetryConfig
    from zgtool.output import console, emit_result, err_console
    from zgtool.results import make_result
    from zgtool.targets import APIS, resolve

    if opts.api is not None and opts.api not in APIS:
        raise UsageError(f"--api must be one of {', '.join(APIS)}, not {opts.api!r}")
    target, found = _detected(opts, resolve(opts.target, opts.config, api=opts.api, model=opts.model,
                                                    headers=opts.headers))
    if found is not None and not opts.as_json:
        err_console.print(found, highlight=False)
    try:
        retry = RetryConfig(max_attempts=opts.max_attempts, max_wait_s=opts.max_wait_s)
        policy = None
        if opts.fallback:
            policy = AutoFallbackPolicy(FallbackConfig(
                (target.model, *opts.fallback), util_threshold_pct=opts.util_threshold_pct,
                recover_below_pct=min(80.0, opts.util_threshold_pct),
                timeouts_to_fallback=opts.fallback_after))
    except ValueError as exc:
        raise UsageError(str(exc)) from exc

    live = opts.stream and not opts.as_json

    def show(piece: str) -> None:
        console.print(piece, end="", markup=False, highlight=False, soft_wrap=True)

    with Client(target, policy=policy, retry=retry, timeout_s=opts.timeout_s, verify=opts.verify) as client:
        try:
            result = client.ask(opts.prompt, max_tokens=opts.max_tokens, system=opts.system, stream=opts.stream,
                                on_text=show if live else None, idempotent=opts.idempotent)
            failed = None
        except RequestFailed as exc:
            result, failed = exc.result, exc
    if live and result.text:
        console.print()
    elif not opts.as_json and result.ok:
        console.print(result.text, markup=False, highlight=False)
    public = target.public() | ({"detected": found} if found is not None else {})
    emit_result(make_result("client.ask", result_data(result), target=public), as_json=opts.as_json, out=opts.out)
    if not opts.as_json:
        render(result, err_console if failed else console)
    if failed is not None:
        f = failed.failure
        status = f.effective_status
        if status is not None and 400 <= status < 500 and status not in (408, 409, 429):
            from zgtool.targets import KEY_HINT

            hint = f"; {KEY_HINT}" if status == 401 else ""
            raise UsageError(f"{target.base_url} refused the request: {f.message} ({status}); not retried{hint}")
        if status in NEVER_RETRIED_STATUSES:
            raise MissingCapability(f"{target.base_url} does not implement this request: {f.message}; not retried")
        raise TargetUnreachable(f"{target.base_url}: {failed}")

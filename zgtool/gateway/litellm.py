"""The LiteLLM proxy (1.110.x) as a gateway, in its own venv under the cache dir.

Venv: `${ZGTOOL_CACHE_DIR:-~/.cache/zgtool}/venvs/litellm`, created on first use (minutes;
progress on stderr), reused after (a marker file names what was installed), guarded by a
file lock so two processes never build it at once. `litellm[proxy]==1.110.*` itself does
not resolve: its `proxy` extra pins `litellm-proxy==1.110.x`, which PyPI does not carry (the
proxy code ships inside the litellm wheel), and exact `litellm-proxy-extras` /
`litellm-enterprise` versions that PyPI does not have yet. So: `litellm==1.110.*`, then the
proxy extra's requirements read from its own metadata, without litellm-proxy and with the
two companions unpinned. Pre-create it with `python -m zgtool.gateway.litellm`.

Config (`<run>/litellm.yaml`), what maps from the pygw side:
- model_list: the client's model name and a `*` wildcard, both `openai/<name>` with
  `api_base` at the upstream's `/v1` (LiteLLM calls the engine's OpenAI API; Anthropic
  `/v1/messages` requests are translated to it and back). Fronting a server whose model was not
  given, the names come from its `GET /v1/models` at start (as a user's config names the models
  their engine serves), so LiteLLM's own listing starts with them; wildcard only when it does not say;
- keys file (pygw's `[keys.<secret>]` or the engine's `[[keys]]`): a generated custom-auth
  module accepts exactly those keys (compared as SHA-256 digests) and gives each its `rpm`
  as LiteLLM's per-key `rpm_limit` (LiteLLM's own virtual keys need Postgres; the token
  bucket's `burst` has no LiteLLM equivalent); a master key is generated for the admin API.
  Without a keys file the proxy is open, like pygw;
- `redis_url`: LiteLLM's response cache in Redis (and its rate-limit counters with it);
- `forward_traceparent` (`zgtool gateway --kind litellm --forward-traceparent`): LiteLLM passes the client's W3C
  `traceparent` on to the engine. By default it does not (an engine's spans then start a trace of their own and
  cannot be joined to the client's request); it forwards it only with its OpenTelemetry callback loaded
  (`callbacks: ["otel"]`, which needs `opentelemetry-sdk` in its environment: the venv has it) and
  `forward_traceparent_to_llm_provider: true` (litellm/proxy/litellm_pre_call_utils.py
  `_add_otel_traceparent_to_data`, 1.110). Its own spans are not wanted here: `OTEL_TRACES_SAMPLER=always_off`
  keeps them unrecorded and unexported (the SDK's TracerProvider reads it), so the forward costs next to nothing.
- `otlp_traces_endpoint` (`--otlp-traces-endpoint URL`): LiteLLM's own spans exported over OTLP/HTTP to URL
  (`latency-split --otlp-listen`'s receiver): its FastAPI server span and `litellm_request`, in the client's trace
  (its otel callback makes the incoming traceparent their parent), from which latency-split reads where LiteLLM
  spent each request (zgtool.latency.analysis.hopspans). Needs `opentelemetry-exporter-otlp-proto-http` beside
  it (the venv has it); exported every 500 ms (OTEL_BSP_SCHEDULE_DELAY) as service `litellm`. Recording and
  exporting spans costs LiteLLM CPU of its own: a tax measured with it on includes that.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import secrets
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from urllib.parse import urlparse

from zgtool.errors import MissingCapability, UsageError
from zgtool.gateway.catalog import Launch, LaunchRequest

LITELLM_SPEC = "litellm==1.110.*"
# LiteLLM's OpenTelemetry callback, without which it forwards no traceparent (its wheel needs only the API)
OTEL_SDK_SPEC = "opentelemetry-sdk"
# its otel callback's OTLP/HTTP exporter (--otlp-traces-endpoint: LiteLLM's own spans)
OTLP_HTTP_SPEC = "opentelemetry-exporter-otlp-proto-http"
VENV_SPEC = f"{LITELLM_SPEC} {OTEL_SDK_SPEC} {OTLP_HTTP_SPEC}"     # what the marker file names
SPANS_PATH = "/v1/traces"
SPAN_EXPORT_DELAY_MS = 500
NETWORK_HINT = "zgtool will create the LiteLLM venv on first use: needs network access to PyPI"
_MARKER = ".zgtool-ok"

# run inside the venv: the requirements of litellm's `proxy` extra that PyPI can satisfy
_PROXY_DEPS = r"""
import importlib.metadata as md
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
for line in md.requires("litellm") or []:
    req = Requirement(line)
    if not req.marker or not req.marker.evaluate({"extra": "proxy"}) or req.marker.evaluate({"extra": ""}):
        continue
    if req.name == "litellm-proxy":      # not on PyPI; its code is in the litellm wheel
        continue
    if req.name.startswith("litellm-"):  # exact companion pins PyPI lags behind
        req.specifier = SpecifierSet("")
    req.marker = None
    print(req)
"""

# the generated custom-auth module: the keys file's keys (or any key when open, like pygw
# without --keys), each with its rpm as LiteLLM's per-key limit
_AUTH_MODULE = '''"""generated by zgtool from {source}: which keys LiteLLM accepts, each with its rpm."""
import hashlib

from fastapi import Request
from litellm.proxy._types import ProxyErrorTypes, ProxyException, UserAPIKeyAuth

OPEN = {open!r}          # no keys file: any key (or none) is accepted, like pygw without --keys
DEFAULT_RPM = {rpm!r}
KEYS = {keys!r}          # SHA-256 hex digest of the key -> name, rpm


async def user_api_key_auth(request: Request, api_key: str) -> UserAPIKeyAuth:
    key = (api_key or "").removeprefix("Bearer ").strip() or request.headers.get("x-api-key", "")
    digest = hashlib.sha256(key.encode()).hexdigest()
    spec = KEYS.get(digest)
    if spec is None:
        if not OPEN:
            raise ProxyException(message="invalid API key", type=ProxyErrorTypes.auth_error, param="api_key",
                                 code=401)
        spec = {{"name": "anonymous", "rpm": DEFAULT_RPM}}
    return UserAPIKeyAuth(api_key=key or None, token=digest, key_alias=spec["name"], rpm_limit=spec["rpm"])
'''


def cache_dir() -> Path:
    return Path(os.environ.get("ZGTOOL_CACHE_DIR") or Path.home() / ".cache" / "zgtool").expanduser()


def venv_dir() -> Path:
    return cache_dir() / "venvs" / "litellm"


def litellm_bin(venv: Path | None = None) -> Path:
    return (venv or venv_dir()) / "bin" / "litellm"


def venv_ready(venv: Path | None = None) -> bool:
    venv = venv or venv_dir()
    marker = venv / _MARKER
    return litellm_bin(venv).exists() and marker.exists() and marker.read_text().strip() == VENV_SPEC


def _say(msg: str) -> None:
    print(f"litellm: {msg}", file=sys.stderr, flush=True)


def _run(argv: list[str], log: Path, what: str) -> str:
    with open(log, "ab") as out:
        proc = subprocess.run(argv, stdout=subprocess.PIPE, stderr=out, stdin=subprocess.DEVNULL)
    if proc.returncode != 0:
        tail = " | ".join(log.read_text(errors="replace").strip().splitlines()[-3:])
        raise MissingCapability(f"{NETWORK_HINT}; {what} failed (exit {proc.returncode}), log {log}: {tail}")
    return proc.stdout.decode()


def ensure_venv(say: Callable[[str], None] = _say) -> Path:
    """The LiteLLM venv, created on first use (a few minutes, needs PyPI); MissingCapability
    (exit 4) naming the log when it cannot be created."""
    venv = venv_dir()
    if venv_ready(venv):
        return venv
    venv.parent.mkdir(parents=True, exist_ok=True)
    lock_path = venv.parent / "litellm.lock"
    with open(lock_path, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # a second process waits here, then finds it ready
        if venv_ready(venv):
            return venv
        log = venv.parent / "litellm-install.log"
        log.write_text("")
        t0 = time.monotonic()
        say(f"creating its venv in {venv} (one time, a few minutes; log {log})")
        if not (venv / "bin" / "python").exists():
            _run([sys.executable, "-m", "venv", str(venv)], log, "python -m venv")
        py = str(venv / "bin" / "python")
        pip = [py, "-m", "pip", "install", "--disable-pip-version-check", "-q"]
        say(f"installing {LITELLM_SPEC} ...")
        _run([*pip, LITELLM_SPEC], log, f"pip install {LITELLM_SPEC}")
        deps = _run([py, "-c", _PROXY_DEPS], log, "reading litellm's proxy requirements").split()
        say(f"installing its proxy server's {len(deps)} requirements ...")
        reqs = venv / "proxy-requirements.txt"
        reqs.write_text("\n".join([*deps, OTEL_SDK_SPEC, OTLP_HTTP_SPEC]) + "\n")
        _run([*pip, "-r", str(reqs)], log, "pip install of the proxy requirements")
        (venv / _MARKER).write_text(VENV_SPEC + "\n")
        say(f"venv ready in {time.monotonic() - t0:.0f} s")
    with contextlib.suppress(OSError):
        lock_path.unlink()
    return venv


def auth_module_source(keys_file: Path | None) -> str:
    """The custom-auth module for a keys file (pygw's or the engine's format), or an open one."""
    from zgtool.gateway.policy import load_keys

    ring = load_keys(keys_file)
    keys = {digest: {"name": pol.name, "rpm": max(1, round(pol.rpm))} for digest, pol in ring.keys.items()}
    source = keys_file.name if keys_file else "no keys file (open)"
    return _AUTH_MODULE.format(source=source, open=ring.open, rpm=max(1, round(ring.default.rpm)), keys=keys)


def _upstream_key_env(keys_file: Path | None) -> str | None:
    """The env var holding the key to send upstream ([upstream] api_key_env, else ZG_UPSTREAM_API_KEY)."""
    env = None
    if keys_file is not None:
        import tomllib

        with contextlib.suppress(OSError, tomllib.TOMLDecodeError):
            env = (tomllib.loads(keys_file.read_text()).get("upstream") or {}).get("api_key_env")
    for name in (env, "ZG_UPSTREAM_API_KEY"):
        if name and os.environ.get(str(name)):
            return str(name)
    return None


MAX_SERVED_NAMES = 32            # routes named from the upstream's listing (a server listing more is unusual)


def upstream_models(upstream: str, keys_file: Path | None, timeout_s: float = 2.0) -> tuple[str, ...]:
    """The model ids the upstream lists at GET /v1/models (with the key LiteLLM sends it), each once,
    no wildcard; () when it does not answer or says nothing usable (the config keeps its wildcard)."""
    import httpx

    env = _upstream_key_env(keys_file)
    headers = {"authorization": f"Bearer {os.environ[env]}"} if env else {}
    try:
        r = httpx.get(upstream.rstrip("/") + "/v1/models", headers=headers, timeout=timeout_s, trust_env=False)
        doc = r.json() if r.status_code == 200 else None
    except (httpx.HTTPError, ValueError):
        return ()
    items = doc.get("data") if isinstance(doc, dict) else None
    ids = [i.get("id") for i in items if isinstance(i, dict)] if isinstance(items, list) else []
    return tuple(dict.fromkeys(i for i in ids if isinstance(i, str) and i.strip() and "*" not in i))[:MAX_SERVED_NAMES]


def spans_url(endpoint: str) -> str:
    """An OTLP/HTTP receiver's base URL or its /v1/traces -> the traces URL LiteLLM's exporter posts to."""
    base = endpoint.rstrip("/")
    return base if base.endswith(SPANS_PATH) else base + SPANS_PATH


def render_config(req: LaunchRequest, *, auth_module: str, served: tuple[str, ...] = ()) -> str:
    """litellm.yaml (YAML written as JSON flow values: every string quoted, nothing to escape by hand):
    a route for req.model, else for each of `served` (the upstream's own listing), then the wildcard."""
    api_base = req.upstream.rstrip("/") + "/v1"
    env = _upstream_key_env(req.keys_file)
    api_key = f"os.environ/{env}" if env else "sk-no-upstream-key"
    named = (req.model,) if req.model else served
    names = [n for n in named if n and n != "*"] + ["*"]
    q = json.dumps
    lines = ["# generated by zgtool; run with: litellm --config <this file> --port <port>", "model_list:"]
    for name in names:
        target = "openai/*" if name == "*" else f"openai/{name}"
        lines += [f"  - model_name: {q(name)}", "    litellm_params:", f"      model: {q(target)}",
                  f"      api_base: {q(api_base)}", f"      api_key: {q(api_key)}",
                  "      timeout: 3600", "      stream_timeout: 3600"]
    # Anthropic /v1/messages -> the engine's chat/completions (LiteLLM 1.110 would otherwise
    # translate to OpenAI's Responses API, which vLLM/SGLang/zgtool do not serve)
    lines += ["litellm_settings:", "  drop_params: true", "  num_retries: 0", "  request_timeout: 3600",
              "  telemetry: false", "  use_chat_completions_url_for_anthropic_messages: true"]
    if req.forward_traceparent or req.otlp_traces_endpoint:
        lines.append('  callbacks: ["otel"]')
    if req.forward_traceparent:
        lines.append("  forward_traceparent_to_llm_provider: true")
    if req.redis_url:
        u = urlparse(req.redis_url)
        if u.scheme not in ("redis", "rediss") or not u.hostname:
            raise UsageError(f"redis URL must be redis://host:port/db, not {req.redis_url!r}")
        lines += ["  cache: true", "  cache_params:", '    type: "redis"', f"    host: {q(u.hostname)}",
                  f"    port: {u.port or 6379}", "    ttl: 300"]
        if u.password:
            lines.append(f"    password: {q(u.password)}")
    # the master key comes from LITELLM_MASTER_KEY (not written here)
    lines += ["general_settings:", f"  custom_auth: {q(auth_module + '.user_api_key_auth')}"]
    lines.append("  disable_spend_logs: true")
    return "\n".join(lines) + "\n"


def launch(req: LaunchRequest) -> Launch:
    venv = ensure_venv()
    config = req.run_dir / f"{req.path}.yaml"
    # LiteLLM 1.110 refuses to start without a master key; it is the admin key here (clients
    # use the keys file's keys, or any key when open), kept in the run folder for the user
    master_key = "sk-zgtool-admin-" + secrets.token_hex(16)
    key_file = req.run_dir / f"{req.path}-master-key"
    key_file.write_text(master_key + "\n")
    key_file.chmod(0o600)
    auth_module = f"zg_{req.path.replace('-', '_')}_auth"
    (req.run_dir / f"{auth_module}.py").write_text(auth_module_source(req.keys_file))
    served = () if req.model else upstream_models(req.upstream, req.keys_file)
    config.write_text(render_config(req, auth_module=auth_module, served=served))
    env = {
        "LITELLM_MASTER_KEY": master_key,
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",   # no fetch of the cost map from the internet at start
        "LITELLM_TELEMETRY": "False",
        "LITELLM_DONT_SHOW_FEEDBACK_BOX": "True",
        "LITELLM_MODE": "PRODUCTION",             # no .env loading
        "VIRTUAL_ENV": str(venv),
        "PATH": f"{venv / 'bin'}:{os.environ.get('PATH', '')}",
    }
    if req.otlp_traces_endpoint:
        env.update(OTEL_EXPORTER="otlp_http", OTEL_ENDPOINT=spans_url(req.otlp_traces_endpoint),
                   OTEL_SERVICE_NAME="litellm", OTEL_BSP_SCHEDULE_DELAY=str(SPAN_EXPORT_DELAY_MS))
    elif req.forward_traceparent:
        env.update(OTEL_TRACES_SAMPLER="always_off", OTEL_EXPORTER="console")  # its own spans: neither kept nor sent
    argv = (str(litellm_bin(venv)), "--config", str(config), "--host", req.host, "--port", str(req.port),
            "--num_workers", "1", "--telemetry", "False")
    return Launch(argv=argv, config=config, env=env, ready_path="/health/liveliness", ready_any_status=False)


if __name__ == "__main__":  # python -m zgtool.gateway.litellm: create the venv now (CI set-up, a warm cache)
    try:
        print(ensure_venv())
    except MissingCapability as exc:
        print(f"zgtool: {exc.message}", file=sys.stderr)
        raise SystemExit(int(exc.exit_code)) from None

"""Where GPU readings come from: dcgm-exporter, Prometheus, NVML or the zgtool engine.

Every source has `describe()` (for results) and `read() -> list[GpuReading]` in the
internal unit set; low-level errors become zgtool errors here and nowhere else.
"""

from __future__ import annotations

import socket
from typing import Any, Protocol
from urllib.parse import urlsplit

from zgtool.dcgm.metrics import (
    DCGM_SAMPLE_NAMES,
    GpuReading,
    derive,
    normalise_dcgm,
    normalise_engine,
    parse_exposition,
)
from zgtool.errors import MissingCapability, TargetUnreachable, UsageError
from zgtool.targets import validate_url
from zgtool.tlsverify import CERT_HINT, is_cert_failure

REMOTE_OPTIONS = (
    "--endpoint URL (a dcgm-exporter /metrics, default port 9400), "
    "--prometheus URL (a Prometheus server scraping dcgm-exporter) or "
    "--engine URL (a zgtool engine's /metrics)"
)
SOURCE_OPTIONS = REMOTE_OPTIONS + ", or --nvml on a machine with an NVIDIA driver"


class Source(Protocol):
    def describe(self) -> dict[str, Any]: ...

    def read(self) -> list[GpuReading]: ...

    def close(self) -> None: ...


def _metrics_url(url: str, default_port: int | None = None) -> str:
    if "://" not in url:
        url = "http://" + url
    validate_url(url)
    parts = urlsplit(url)
    if default_port and parts.port is None and parts.scheme == "http":
        url = url.replace(parts.netloc, f"{parts.netloc}:{default_port}", 1)
        parts = urlsplit(url)
    if parts.path in ("", "/"):
        url = url.rstrip("/") + "/metrics"
    return url


class _HttpSource:
    kind = "http"
    what = "endpoint"

    def __init__(self, url: str, timeout_s: float = 5.0, verify: bool | str = True) -> None:
        import httpx  # lazy: keeps `zgtool --help` fast

        self.url = url
        self._client = httpx.Client(timeout=timeout_s, verify=verify)

    def describe(self) -> dict[str, Any]:
        return {"kind": self.kind, "url": self.url}

    def close(self) -> None:
        self._client.close()

    def _get(self, url: str, **params: Any) -> Any:
        import httpx

        try:
            resp = self._client.get(url, params=params or None)
        except httpx.TimeoutException as exc:
            raise TargetUnreachable(f"{self.what} {url} timed out: {exc}") from exc
        except httpx.HTTPError as exc:
            if is_cert_failure(exc):
                raise TargetUnreachable(f"{self.what} {url}: the TLS certificate did not verify; {CERT_HINT}") from exc
            raise TargetUnreachable(f"cannot reach {self.what} {url}: {exc}") from exc
        return resp


class ExporterSource(_HttpSource):
    """A dcgm-exporter /metrics endpoint (classic or 4.9+ names)."""

    kind = "exporter"
    what = "dcgm-exporter"

    def __init__(self, url: str, timeout_s: float = 5.0, verify: bool | str = True) -> None:
        super().__init__(_metrics_url(url, default_port=9400), timeout_s, verify)

    def read(self) -> list[GpuReading]:
        resp = self._get(self.url)
        if resp.status_code != 200:
            raise TargetUnreachable(f"dcgm-exporter {self.url} answered HTTP {resp.status_code}, not a /metrics page")
        rows = normalise_dcgm(parse_exposition(resp.text))
        if not rows:
            raise UsageError(
                f"{self.url} serves no DCGM GPU metrics (DCGM_FI_DEV_* with a gpu label); "
                "is this a dcgm-exporter /metrics?"
            )
        return rows


class PrometheusSource(_HttpSource):
    """A Prometheus server: one instant query returns every GPU of the fleet."""

    kind = "prometheus"
    what = "Prometheus"

    def __init__(self, url: str, selector: str = "", timeout_s: float = 5.0, verify: bool | str = True) -> None:
        if "://" not in url:
            url = "http://" + url
        validate_url(url)
        super().__init__(url.rstrip("/"), timeout_s, verify)
        self.selector = selector.strip().strip("{}").strip()
        names = "|".join(DCGM_SAMPLE_NAMES)
        extra = f",{self.selector}" if self.selector else ""
        self.query = f'{{__name__=~"{names}"{extra}}}'

    def describe(self) -> dict[str, Any]:
        return {"kind": self.kind, "url": self.url, "query": self.query}

    def read(self) -> list[GpuReading]:
        resp = self._get(f"{self.url}/api/v1/query", query=self.query)
        try:
            body = resp.json()
        except ValueError as exc:
            raise TargetUnreachable(
                f"{self.url} answered HTTP {resp.status_code} without JSON; is it a Prometheus server?"
            ) from exc
        if body.get("status") != "success":
            err = body.get("error") or f"HTTP {resp.status_code}"
            raise UsageError(f"Prometheus rejected the query {self.query}: {err}")
        samples = []
        for item in body.get("data", {}).get("result", []):
            labels = dict(item.get("metric", {}))
            name = labels.pop("__name__", "")
            try:
                value = float(item["value"][1])
            except (KeyError, IndexError, TypeError, ValueError):
                continue
            samples.append((name, labels, value))
        rows = normalise_dcgm(samples)
        if not rows:
            raise UsageError(
                f"Prometheus at {self.url} has no DCGM series for {self.query}; is it scraping dcgm-exporter?"
            )
        return rows


class EngineSource(_HttpSource):
    """The zgtool engine's /metrics: KV use, running/waiting, batch and GPU figures if any."""

    kind = "engine"
    what = "engine"

    def __init__(self, url: str, timeout_s: float = 5.0, verify: bool | str = True) -> None:
        super().__init__(_metrics_url(url), timeout_s, verify)
        self.key = urlsplit(self.url).netloc

    def read(self) -> list[GpuReading]:
        resp = self._get(self.url)
        if resp.status_code != 200:
            raise TargetUnreachable(f"engine {self.url} answered HTTP {resp.status_code}, not a /metrics page")
        samples = parse_exposition(resp.text)
        row = normalise_engine(samples, self.key)
        if not row.metrics:
            raise UsageError(f"{self.url} exports none of the engine metrics (zg_*, vllm:*, sglang:*, tgi_* or "
                             "llamacpp:*: llama-server exports them with --metrics)")
        # An engine on a GPU next to a dcgm-exporter-style exposition: show both.
        return [row, *normalise_dcgm(samples)]


class NvmlSource:
    """The local driver through nvidia-ml-py: power in mW, memory in bytes, clocks in MHz."""

    kind = "nvml"

    def __init__(self) -> None:
        self._nvml = load_nvml()
        self.host = socket.gethostname()
        n = self._nvml.nvmlDeviceGetCount()
        self._handles = [self._nvml.nvmlDeviceGetHandleByIndex(i) for i in range(n)]
        if not self._handles:
            raise MissingCapability("NVML found no GPU on this machine; use " + REMOTE_OPTIONS)

    def describe(self) -> dict[str, Any]:
        return {"kind": self.kind, "host": self.host, "gpus": len(self._handles)}

    def close(self) -> None:
        try:
            self._nvml.nvmlShutdown()
        except self._nvml.NVMLError:
            pass

    def read(self) -> list[GpuReading]:
        return [self._read_one(i, h) for i, h in enumerate(self._handles)]

    def _read_one(self, index: int, h: Any) -> GpuReading:
        nv = self._nvml
        m: dict[str, float] = {}

        def opt(fn: Any, *args: Any) -> Any:
            # One unsupported field (e.g. power on some boards) must not hide the rest.
            try:
                return fn(h, *args)
            except nv.NVMLError:
                return None

        util = opt(nv.nvmlDeviceGetUtilizationRates)
        if util is not None:
            m["gpu_util_pct"] = float(util.gpu)
            m["mem_copy_util_pct"] = float(util.memory)
        mem = opt(nv.nvmlDeviceGetMemoryInfo)
        if mem is not None:
            m.update(fb_used_bytes=float(mem.used), fb_free_bytes=float(mem.free), fb_total_bytes=float(mem.total))
        clock = opt(nv.nvmlDeviceGetClockInfo, nv.NVML_CLOCK_SM)
        if clock is not None:
            m["sm_clock_mhz"] = float(clock)
        power_mw = opt(nv.nvmlDeviceGetPowerUsage)
        if power_mw is not None:
            m["power_w"] = power_mw / 1000.0
        name = opt(nv.nvmlDeviceGetName) or ""
        uuid = opt(nv.nvmlDeviceGetUUID) or ""
        return GpuReading(
            key=f"{self.host}/gpu{index}", host=self.host, gpu=str(index),
            uuid=uuid.decode() if isinstance(uuid, bytes) else str(uuid),
            model=name.decode() if isinstance(name, bytes) else str(name),
            metrics=derive(m),
        )


def load_nvml() -> Any:
    """Import and initialise pynvml, or raise MissingCapability naming the other sources."""
    try:
        import pynvml
    except ImportError as exc:
        raise MissingCapability(
            "NVML unavailable: the nvidia-ml-py package is not installed; use " + REMOTE_OPTIONS
        ) from exc
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        raise MissingCapability(
            f"NVML unavailable ({exc}): no NVIDIA driver on this machine; use " + REMOTE_OPTIONS
        ) from exc
    return pynvml


def open_source(
    *, endpoint: str | None, prometheus: str | None, engine: str | None, nvml: bool, selector: str = "",
    verify: bool | str = True,
) -> Source:
    """Exactly one source; with none given, NVML if a driver is present, else exit 4 listing options."""
    given = [name for name, v in (("--endpoint", endpoint), ("--prometheus", prometheus),
                                  ("--engine", engine), ("--nvml", nvml)) if v]
    if len(given) > 1:
        raise UsageError(f"choose one source, not {' and '.join(given)}")
    if selector and not prometheus:
        raise UsageError("--selector only applies to --prometheus")
    if endpoint:
        return ExporterSource(endpoint, verify=verify)
    if prometheus:
        return PrometheusSource(prometheus, selector=selector, verify=verify)
    if engine:
        return EngineSource(engine, verify=verify)
    if nvml:
        return NvmlSource()
    try:
        return NvmlSource()
    except MissingCapability as exc:
        raise MissingCapability(
            f"no source given and no local GPU driver ({exc.message.split(':', 1)[0]}); choose one of: "
            + SOURCE_OPTIONS
        ) from exc

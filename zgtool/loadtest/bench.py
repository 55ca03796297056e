"""Drive k6: gateway vs direct vs direct-stream (constant rate) and the rate ramp (knee)."""

from __future__ import annotations

import json
import socket
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from zgtool.errors import TargetUnreachable, UsageError
from zgtool.loadtest import scripts
from zgtool.loadtest.config import BenchConfig, RampConfig, k6_duration
from zgtool.loadtest.differences import p50_differences, reconnect_notes, with_p50_intervals
from zgtool.loadtest.k6bin import k6_version
from zgtool.loadtest.points import read_points
from zgtool.loadtest.runner import K6Run, run_k6
from zgtool.loadtest.segments import Segment
from zgtool.loadtest.summary import BenchResult, RampPath, ramp_path, run_duration_s, scenario_stats
from zgtool.loadtest.ttft import TtftAtRate, poisson_ttft
from zgtool.targets import Target

TTFT_NOTE = ("direct_stream: k6 reads an SSE body only as a whole, so http_req_waiting is the time to the "
             "response headers, not time to first token; zgtool measures streaming TTFT under load with its "
             "own client: zgtool latency-split -c N")


def check_reachable(target: Target, timeout_s: float = 3.0) -> None:
    """Fail fast (exit 3) instead of letting k6 count a whole run of refused connections."""
    try:
        with socket.create_connection((target.host, target.port), timeout=timeout_s):
            pass
    except OSError as exc:
        raise TargetUnreachable(f"{target.name} ({target.url}) is unreachable: {exc}") from exc


def _headers_json(target: Target) -> str:
    return json.dumps(target.auth_headers())


def bench_env(config: BenchConfig, direct: Target, gateway: Target | None, payload: Path) -> dict[str, str]:
    """The k6 script's settings (k6/gateway_vs_direct.js reads them from its environment)."""
    return {
        "DIRECT_URL": direct.api_root_url,        # the script appends ENDPOINT (/v1/...)
        "GATEWAY_URL": gateway.api_root_url if gateway else "",
        "ENDPOINT": scripts.ENDPOINTS[config.api],
        "PAYLOAD": str(payload),
        "RATE": str(config.rate_rps),
        "DURATION": k6_duration(config.duration_s),
        "PRE_VUS": str(config.pre_allocated_vus),
        "MAX_VUS": str(config.max_vus),
        "SCENARIOS": ",".join(config.scenarios),
        "SEQUENTIAL": "1" if config.sequential else "0",
        "ROUNDS": str(config.turns),
        # keys travel in the environment, never on k6's command line
        "ARRIVALS": config.arrivals,
        "REQUEST_TIMEOUT": k6_duration(config.request_timeout_s),
        "DIRECT_HEADERS": _headers_json(direct),
        "GATEWAY_HEADERS": _headers_json(gateway) if gateway else "{}",
    }


def k8s_manifests(config: BenchConfig, *, direct: Target, gateway: Target | None, parallelism: int,
                  name: str = "zgtool-bench") -> dict[str, str]:
    """The same scenario as a k6-operator TestRun (see zgtool/loadtest/k8s.py)."""
    from zgtool.loadtest.k8s import manifests

    if "gateway" in config.scenarios and gateway is None:
        raise UsageError("the gateway scenario needs --gateway TARGET (or --scenarios direct,...)")
    payload = Path(config.payload or scripts.payload(config.api))
    return manifests(name=name, parallelism=parallelism,
                     script=scripts.script(scripts.GATEWAY_VS_DIRECT).read_text(), payload=payload.read_text(),
                     env=bench_env(config, direct, gateway, payload))


def run_bench(config: BenchConfig, *, direct: Target, gateway: Target | None, k6: Path,
              run_dir: Path | None = None, progress: bool = True, segment: Segment | None = None) -> BenchResult:
    """One k6 run. k6 also writes every request's points to run_dir/points.csv.gz: the p50 differences'
    intervals read them, a segment carries them for `bench merge`, --otlp-endpoint reads them."""
    if "gateway" in config.scenarios and gateway is None:
        raise UsageError("the gateway scenario needs --gateway TARGET (or --start, or --scenarios direct,...)")
    needs_direct = any(s.startswith("direct") for s in config.scenarios)
    for t in ([direct] if needs_direct else []) + ([gateway] if gateway and "gateway" in config.scenarios else []):
        check_reachable(t)
    run_dir = run_dir or Path(tempfile.mkdtemp(prefix="zgtool-bench-"))
    payload = Path(config.payload or scripts.payload(config.api)).resolve()
    env = bench_env(config, direct, gateway, payload)
    points_file = run_dir.resolve() / "points.csv.gz"   # always: the p50 differences' intervals read it
    extra = (*(segment.k6_args() if segment else ()), "--out", f"csv={points_file}")
    run = K6Run(k6=k6, script=scripts.script(scripts.GATEWAY_VS_DIRECT), env=env, run_dir=run_dir,
                expected_s=config.expected_s, timeout_s=config.expected_s + 120, extra_args=extra)
    label = "k6 " + " → ".join(config.scenarios) + (f" (segment {segment.label})" if segment else "")
    out = run_k6(run, progress=progress, label=label)
    urls = {"gateway": gateway.base_url if gateway else "", "direct": direct.base_url,
            "direct_stream": direct.base_url}
    stats = {
        name: scenario_stats(out.summary, name, url=urls[name], stream=name == "direct_stream", rounds=config.turns,
                             rate_rps=config.rate_rps, duration_s=config.duration_s, arrivals=config.arrivals)
        for name in config.scenarios
    }
    requests = sum(s.requests for s in stats.values())
    failures = sum(s.failures for s in stats.values())
    dropped = sum(s.dropped_iterations for s in stats.values())
    notes = [TTFT_NOTE] if "direct_stream" in stats else []
    if dropped:
        notes.append(f"the load generator could not keep the rate: {dropped} iterations dropped "
                     f"(raise --max-vus, lower --rate, or give k6 its own machine)")
    notes.extend(reconnect_notes(stats))
    notes.extend(f"k6: {w}" for w in out.warnings[:5])
    notes.extend(first_failures(out.log_path))
    points = read_points(points_file)
    stats = with_p50_intervals(stats, points)
    return BenchResult(
        k6_version=k6_version(k6), script=run.script.name,
        config={"rate_rps": config.rate_rps, "duration_s": config.duration_s,
                "pre_allocated_vus": config.pre_allocated_vus, "max_vus": config.max_vus,
                "sequential": config.sequential, "rounds": config.turns, "api": config.api, "payload": str(payload),
                "arrivals": config.arrivals,
                "endpoint": env["ENDPOINT"], "run_dir": str(run_dir)},
        scenarios=stats, requests=requests, failures=failures,
        failure_rate=failures / requests if requests else float("nan"),
        dropped_iterations=dropped, load_generator_saturated=dropped > 0,
        test_run_s=run_duration_s(out.summary), notes=notes,
        segment=segment.label if segment else None,
        points=points if segment else None,
        differences=p50_differences(points, list(stats)),
    )


FAILURE_MARK = "zgtool-failure "


def first_failures(log_path: Path) -> list[str]:
    """One failed request per scenario as the k6 script logged it (its URL, the status or k6's error, the start of
    the body): what a run's failure count alone does not say, e.g. a 404 from a path the server does not serve."""
    try:
        text = log_path.read_text(errors="replace")
    except OSError:
        return []
    seen: dict[str, str] = {}
    for line in text.splitlines():
        at = line.find(FAILURE_MARK)
        if at < 0:
            continue
        said = line[at + len(FAILURE_MARK):]
        if said.endswith('" source=console'):           # k6's logfmt: msg="..." source=console
            said = said[:-len('" source=console')]
        scenario, _, what = said.partition(" ")
        seen.setdefault(scenario, what.replace('\\"', '"').replace('\\\\', '\\'))
    return [f"{scenario}: a failed request: {what}" for scenario, what in seen.items()]


@dataclass(frozen=True)
class RampResult:
    """The data of a "bench.k6.ramp" result: p95 per rate step per path, and each knee."""

    k6_version: str
    script: str
    config: dict[str, Any]
    paths: list[RampPath]
    notes: list[str]
    ttft_at_knee: list[TtftAtRate] = field(default_factory=list)


def run_ramp(config: RampConfig, targets: dict[str, Target], *, k6: Path, run_dir: Path | None = None,
             progress: bool = True) -> RampResult:
    if not targets:
        raise UsageError("the ramp needs at least one target")
    for t in targets.values():
        check_reachable(t)
    run_dir = run_dir or Path(tempfile.mkdtemp(prefix="zgtool-ramp-"))
    env = {
        "TARGETS": json.dumps({name: t.api_root_url for name, t in targets.items()}),    # + ENDPOINT
        "RATES": ",".join(map(str, config.rates)),
        "STEP": k6_duration(config.step_s),
        "WARMUP": k6_duration(config.warmup_s) if config.warmup_s else "0s",
        "ENDPOINT": scripts.ENDPOINTS[config.api],
        "PAYLOAD": str(Path(config.payload or scripts.payload(config.api)).resolve()),
        "STREAM": "1" if config.stream else "0",
        "ARRIVALS": config.arrivals,
        "REQUEST_TIMEOUT": k6_duration(config.request_timeout_s),
        "PRE_VUS": str(config.pre_allocated_vus),
        "MAX_VUS": str(config.max_vus),
        "HEADERS_BY_PATH": json.dumps({name: t.auth_headers() for name, t in targets.items()}),
    }
    expected = config.expected_s(len(targets))
    run = K6Run(k6=k6, script=scripts.script(scripts.RAMP), env=env, run_dir=run_dir, expected_s=expected,
                summary_name="ramp-summary.json", timeout_s=expected + 120)
    out = run_k6(run, progress=progress, label="k6 ramp " + " → ".join(targets))
    paths = [ramp_path(out.summary, name, t.base_url, list(config.rates), config.step_s,
                       knee_factor=config.knee_factor, poisson=config.arrivals == "poisson")
             for name, t in targets.items()]
    notes = [f"knee: the rate from which on every step's p95 is >= {config.knee_factor:g}x the low-rate p95 "
             "(the lower of the first two steps), or >1% of requests fail, or <90% of them start; "
             f"{config.warmup_s:g} s of warm-up at the first rate are not counted"]
    notes.extend(f"k6: {w}" for w in out.warnings[:5])
    notes.extend(first_failures(out.log_path))
    if config.arrivals == "poisson":
        notes.append("arrivals: Poisson (k6 Bernoulli thinning, 20 ticks per request; see k6/ramp.js)")
    answered = [p for p in paths if any(s.requests > s.failures for s in p.steps)]   # a knee to measure TTFT at
    ttft = ttft_at_knee(config, targets, answered) if config.ttft_at_knee_s > 0 else []
    if ttft:
        notes.append(f"TTFT at the knee: zgtool's own streaming client, Poisson arrivals, "
                     f"{config.ttft_at_knee_s:g} s per rate, TTFT from the scheduled arrival")
    return RampResult(k6_version(k6), run.script.name,
                      {"rates": list(config.rates), "step_s": config.step_s, "warmup_s": config.warmup_s, "api": config.api,
                       "stream": config.stream, "max_vus": config.max_vus, "run_dir": str(run_dir),
                       "arrivals": config.arrivals, "ttft_at_knee_s": config.ttft_at_knee_s},
                      paths, notes, ttft)


def knee_rates(path: RampPath) -> list[float]:
    """The step before the knee and the knee itself (the top rate when no knee was found)."""
    rates = [s.rate_rps for s in path.steps]
    if not rates:
        return []
    knee = path.knee_rps if path.knee_rps is not None else rates[-1]
    i = rates.index(knee)
    return rates[max(0, i - 1):i + 1]


def ttft_at_knee(config: RampConfig, targets: dict[str, Target], paths: list[RampPath]) -> list[TtftAtRate]:
    out = []
    for path in paths:
        for rate in knee_rates(path):
            out.append(poisson_ttft(targets[path.name], rate, config.ttft_at_knee_s, seed=int(rate)))
    return out

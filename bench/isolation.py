"""Can one client's requests harm another's? 16 victim streams beside each hostile request class.

    .venv/bin/python bench/isolation.py [--model dummy:tiny] [--path direct|stack] [--rounds 3]
        [--classes none|a,b] [--checks tenancy,silence,freeze] [--freeze-model smollm2]

Per class (poison parameters, huge messages, long stops, a saturating second key, KV pressure on a
small pool) the hostile load runs continuously while 16 greedy victim streams (both APIs) run
`--rounds` times; printed: the victims' TTFT p99 and ITL p99, their ratio to a quiet run in the same
invocation (KV pressure: to a quiet run on the same small-pool engine), and "requests lost"
(accepted with neither an answer nor an error event; must be 0). Hostile 5xx and failed victims are
counted too. TTFT and ITL are what the victim's client saw (a frozen event loop shows there; a busy
client reading coalesced events makes quiet ITLs tiny); "engine's" ITL is from the engine's own
per-token times and TTFT (the zgtool-timing SSE comment). The last line is one JSON
object; the exit status is 1 when anything was lost.
On a shared CPU, read the ratios, not the absolute times.

``--checks`` adds issue 37's measurements (bench/isolation_fronts.py): ``tenancy`` (a free key's
TTFT beside a pro key's 32 streams, direct and through the keyed stack side by side), ``silence``
(the longest silence of 32 streams on --kv-memory-mb 1 against the keepalive interval) and
``freeze`` (a victim's stream time and /health beside four 7 MB prompts vs alone, on
--freeze-model); each is one more row, and a "checks" object in the JSON line.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
import tempfile
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "reliability"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "support"))
from engine_live import keys_toml  # noqa: E402  (the live-engine fixture the tests use)
from victims import Outcome, Victim, dumps_raw, lost, send, victims  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
import isolation_fronts  # noqa: E402

from zgtool.gateway.supervisor import LocalStack, StackConfig  # noqa: E402
from zgtool.stats import percentile  # noqa: E402

VICTIM_KEY = "sk-iso-victim"
HOSTILE_KEY = "sk-iso-hostile"
ADMIN_KEY = "sk-iso-admin"
KEYS = keys_toml({"victim": VICTIM_KEY, "hostile": HOSTILE_KEY}, (ADMIN_KEY,), tier="open")
N_VICTIMS = 16


@dataclass(frozen=True)
class HostileClass:
    name: str
    bodies: Callable[[str], list[tuple[str, bytes]]]   # model -> [(api, body)], sent round-robin
    concurrency: int                                   # hostile requests in flight at once
    small_kv: bool = False                             # run on the small-pool engine


def _body(model: str, *, api: str = "anthropic", content: Any = "hello", max_tokens: int = 16,
          stream: bool = True, **extra: Any) -> tuple[str, bytes]:
    msgs = content if isinstance(content, list) else [{"role": "user", "content": content}]
    return api, dumps_raw({"model": model, "max_tokens": max_tokens, "stream": stream, "messages": msgs, **extra})


def _poison(model: str) -> list[tuple[str, bytes]]:
    out = []
    for api in ("anthropic", "openai"):
        for kw in ({"temperature": 1e-300}, {"temperature": 5e-324}, {"temperature": 1e-38},
                   {"temperature": "NaN"}, {"top_p": 1e-300}, {"top_k": 2**63}, {"seed": 2**63 - 1},
                   {"temperature": 1e-300, "top_p": 1e-300, "top_k": 1}):
            out.append(_body(model, api=api, max_tokens=32, **kw))
    return out


def _huge_messages(model: str) -> list[tuple[str, bytes]]:
    empty = [{"role": "user", "content": ""}]
    return [_body(model, content=empty * 100_000), _body(model, api="openai", content=empty * 200_000),
            _body(model, content="x" * 1_000_000), _body(model, api="openai", content="hello " * 100_000),
            _body(model, content=[{"role": "user", "content": [{"type": "text", "text": "a"}] * 50_000}])]


def _long_stops(model: str) -> list[tuple[str, bytes]]:
    stops = [chr(0x4E00 + i) * 256 for i in range(16)]       # the accepted maximum: 16 x 256
    return [_body(model, max_tokens=200, stop_sequences=stops),
            _body(model, api="openai", max_tokens=200, stop=[s[:256] for s in stops[:4]], ignore_eos=True),
            _body(model, stop_sequences=["y" * 1024] * 2000), _body(model, stop_sequences=["z" * 1_000_000])]


def _saturating_key(model: str) -> list[tuple[str, bytes]]:
    return [_body(model, api="openai", max_tokens=256, ignore_eos=True, content=f"flood {i}") for i in range(8)]


def _kv_pressure(model: str) -> list[tuple[str, bytes]]:
    # ~400 prompt + 600 output tokens on dummy:tiny: 63 of the 1 MB pool's 256 blocks each
    return [_body(model, api="openai", max_tokens=600, ignore_eos=True, content=f"{i} " + "hello " * 66)
            for i in range(6)]


CLASSES = (
    HostileClass("poison_params", _poison, concurrency=4),
    HostileClass("huge_messages", _huge_messages, concurrency=2),
    HostileClass("long_stops", _long_stops, concurrency=4),
    HostileClass("saturating_key", _saturating_key, concurrency=48),
    HostileClass("kv_pressure", _kv_pressure, concurrency=6, small_kv=True),
)


@dataclass
class ClassResult:
    name: str
    victims: list[Outcome] = field(default_factory=list)
    hostile: list[Outcome] = field(default_factory=list)

    def ttft_p99_ms(self) -> float:
        return percentile([o.ttft_s * 1e3 for o in self.victims if o.ttft_s is not None], 99)

    def itl_p99_ms(self) -> float:
        return percentile([x * 1e3 for o in self.victims for x in o.itls_s], 99)

    def engine_ttft_p99_ms(self) -> float:
        return percentile([o.engine_ttft_ms for o in self.victims if o.engine_ttft_ms is not None], 99)

    def engine_itl_p99_ms(self) -> float:
        return percentile([x for o in self.victims for x in o.engine_itls_ms], 99)

    def lost(self) -> int:
        return sum(lost(o) for o in self.victims + self.hostile)

    def victims_failed(self) -> int:
        return sum(not (o.status == 200 and o.complete and o.error is None) for o in self.victims)

    def hostile_5xx(self) -> int:
        return sum(bool(o.failure) or (o.status or 0) >= 500 or (o.error or {}).get("type") in
                   ("api_error", "server_error", "overloaded_error") for o in self.hostile)


async def _victim_rounds(client: httpx.AsyncClient, url: str, vics: list[Victim], rounds: int) -> list[Outcome]:
    out: list[Outcome] = []
    for _ in range(rounds):
        out += await asyncio.gather(*(send(client, url, v.api, v.body, key=VICTIM_KEY, label=v.name) for v in vics))
    return out


async def _run_class(url: str, hc: HostileClass | None, model: str, rounds: int) -> ClassResult:
    vics = victims(N_VICTIMS, model, max_tokens=48)
    res = ClassResult(hc.name if hc else "quiet")
    limits = httpx.Limits(max_connections=N_VICTIMS + (hc.concurrency if hc else 0) + 8)
    async with httpx.AsyncClient(timeout=httpx.Timeout(300.0), limits=limits) as client:
        if hc is None:
            res.victims = await _victim_rounds(client, url, vics, rounds)
            return res
        bodies = hc.bodies(model)
        stop = asyncio.Event()
        started = asyncio.Event()

        async def worker(i: int) -> None:
            n = i
            while not stop.is_set():
                api, body = bodies[n % len(bodies)]
                n += hc.concurrency
                task = asyncio.create_task(send(client, url, api, body, key=HOSTILE_KEY, label=hc.name,
                                                timeout_s=300.0, first_token=started))
                res.hostile.append(await task)
                started.set()        # a request that ended without a token still counts as load

        workers = [asyncio.create_task(worker(i)) for i in range(hc.concurrency)]
        await started.wait()
        res.victims = await _victim_rounds(client, url, vics, rounds)
        stop.set()
        await asyncio.gather(*workers)
    return res


@contextlib.contextmanager
def _engine(model: str, path: str, run_dir: Path, extra: tuple[str, ...]) -> Iterator[tuple[str, str]]:
    keys = run_dir / "keys.toml"
    keys.write_text(KEYS)
    paths = ("stack",) if path == "stack" else ()
    engine_args = extra if path == "stack" else ("--keys", str(keys), *extra)
    cfg = StackConfig(model=model, paths=paths, pygw_keys=keys if path == "stack" else None, pygw_policy="none",
                      engine_args=engine_args, run_dir=run_dir)
    with LocalStack(cfg) as st:
        yield st.urls[path], st.urls["direct"]


def _kv_used(direct: str) -> int:
    r = httpx.get(direct + "/admin/kv", headers={"x-api-key": ADMIN_KEY}, timeout=30)
    return int(r.json()["kv_blocks_used"]) if r.status_code == 200 else -1


def _row(res: ClassResult, quiet: ClassResult) -> dict[str, Any]:
    def ratio(a: float, b: float) -> float | None:
        return round(a / b, 2) if b > 0 and a == a else None

    statuses = Counter(str(o.status) if o.status else "none" for o in res.hostile)
    return {
        "ttft_p99_ms": round(res.ttft_p99_ms(), 2), "itl_p99_ms": round(res.itl_p99_ms(), 3),
        "engine_ttft_p99_ms": round(res.engine_ttft_p99_ms(), 2),
        "engine_itl_p99_ms": round(res.engine_itl_p99_ms(), 3),
        "engine_ttft_p99_ratio": ratio(res.engine_ttft_p99_ms(), quiet.engine_ttft_p99_ms()),
        "ttft_p99_ratio": ratio(res.ttft_p99_ms(), quiet.ttft_p99_ms()),
        "itl_p99_ratio": ratio(res.itl_p99_ms(), quiet.itl_p99_ms()),
        "engine_itl_p99_ratio": ratio(res.engine_itl_p99_ms(), quiet.engine_itl_p99_ms()),
        "victim_runs": len(res.victims), "victims_failed": res.victims_failed(),
        "hostile_sent": len(res.hostile), "hostile_status": dict(statuses), "hostile_5xx": res.hostile_5xx(),
        "requests_lost": res.lost(),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="dummy:tiny")
    ap.add_argument("--path", choices=("direct", "stack"), default="direct")
    ap.add_argument("--rounds", type=int, default=3, help="victim rounds per class (16 streams each)")
    ap.add_argument("--kv-memory-mb", type=int, default=1, help="pool of the KV-pressure engine")
    ap.add_argument("--classes", default=",".join(c.name for c in CLASSES), help="'none': only --checks")
    ap.add_argument("--checks", default="", help="tenancy,silence,freeze (issue 37; bench/isolation_fronts.py)")
    ap.add_argument("--freeze-model", default="smollm2", help="the model of the freeze check")
    args = ap.parse_args(argv)
    wanted = [c for c in CLASSES if c.name in args.classes.split(",")]
    checks = [c for c in args.checks.split(",") if c]
    unknown = set(checks) - {"tenancy", "silence", "freeze"}
    if unknown:
        ap.error(f"--checks: unknown {sorted(unknown)}")
    rows: dict[str, dict[str, Any]] = {}
    leftover: dict[str, int] = {}
    with tempfile.TemporaryDirectory(prefix="zg-isolation-") as tmp:
        for small in (False, True):
            group = [c for c in wanted if c.small_kv == small]
            if not group:
                continue
            extra = ("--kv-memory-mb", str(args.kv_memory_mb)) if small else ()
            run_dir = Path(tmp) / ("small-kv" if small else "default")
            run_dir.mkdir()
            with _engine(args.model, args.path, run_dir, extra) as (url, direct):
                asyncio.run(_run_class(url, None, args.model, 1))   # warm-up (first-request costs), dropped
                quiet = asyncio.run(_run_class(url, None, args.model, args.rounds))
                qname = "quiet_small_kv" if small else "quiet"
                rows[qname] = _row(quiet, quiet)
                print(_line(qname, rows[qname]), flush=True)
                for hc in group:
                    res = asyncio.run(_run_class(url, hc, args.model, args.rounds))
                    rows[hc.name] = _row(res, quiet)
                    print(_line(hc.name, rows[hc.name]), flush=True)
                leftover[qname] = _kv_used(direct)
        checked = _run_checks(checks, args.model, args.freeze_model, Path(tmp))
    total_lost = sum(r["requests_lost"] for r in rows.values())
    print(json.dumps({"bench": "isolation", "model": args.model, "path": args.path, "victims": N_VICTIMS,
                      "rounds": args.rounds, "classes": rows, "kv_blocks_used_after": leftover,
                      "requests_lost": total_lost, "checks": checked}))
    return 1 if total_lost else 0


def _run_checks(checks: list[str], model: str, freeze_model: str, tmp: Path) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if "tenancy" in checks:
        r = out["tenancy"] = isolation_fronts.tenancy(model, tmp / "tenancy")
        print(f"tenancy          free key TTFT beside 32 pro streams: direct median {r['direct_ttft_ms']['median']} ms "
              f"(max {r['direct_ttft_ms']['max']}), keyed stack median {r['stack_ttft_ms']['median']} ms "
              f"(max {r['stack_ttft_ms']['max']}): stack/direct x{r['stack_over_direct_median']} (goal <= 2)",
              flush=True)
    if "silence" in checks:
        r = out["silence"] = isolation_fronts.silence(model, tmp / "silence")
        on, off = r["keepalive"], r["no_keepalive"]
        print(f"silence          {r['streams']} streams on --kv-memory-mb 1: longest silence {on['longest_silence_s']} s "
              f"with keepalives every {r['keepalive_s']} s (goal <= {r['goal_s']} s; median of each stream's longest "
              f"{on['median_longest_silence_s']} s), {off['longest_silence_s']} s without (median "
              f"{off['median_longest_silence_s']} s); statuses {on['statuses']} / {off['statuses']}", flush=True)
    if "freeze" in checks:
        r = out["freeze"] = isolation_fronts.freeze(freeze_model, tmp / "freeze")
        b, f, a = r["beside"], r["flood"], r["health_ms_alone"]

        def h(x: dict[str, Any]) -> str:
            return f"/health p50 {x['p50']} p99 {x['p99']} max {x['max']} ms"

        print(f"freeze           {freeze_model} victim {r['victim_alone_s']} s alone ({h(a)}); beside four 7 MB "
              f"prompts {b['victim_s']} s (x{b['victim_ratio']}, goal <= 1.5; {h(b['health_ms'])}, goal < 100); "
              f"beside the four resent for its whole run (a flood, {f['hostile_answered']} answered) {f['victim_s']} s "
              f"(x{f['victim_ratio']}; {h(f['health_ms'])})", flush=True)
    return out


def _line(name: str, r: dict[str, Any]) -> str:
    def f(v: Any) -> str:
        return "-" if v is None else f"{v}"

    return (f"{name:16s} TTFT p99 {r['ttft_p99_ms']:9.2f} ms (x{f(r['ttft_p99_ratio'])}; "
            f"engine's x{f(r['engine_ttft_p99_ratio'])})  "
            f"ITL p99 {r['itl_p99_ms']:8.3f} ms (x{f(r['itl_p99_ratio'])}; engine's x{f(r['engine_itl_p99_ratio'])})  "
            f"victims failed {r['victims_failed']}"
            f"/{r['victim_runs']}  hostile {r['hostile_sent']} {r['hostile_status']} 5xx {r['hostile_5xx']}  "
            f"lost {r['requests_lost']}")


if __name__ == "__main__":
    sys.exit(main())

"""The gateway tax from one `zgtool latency-split` sweep (scripts/gateway_tax.sh, issue 35 part 5):
per gateway path and concurrency, TTFT (p50) and per-token time (TPOT, means) difference against
the direct path, in ms and as a share of the engine's own per-token time (the direct path's TPOT at
that concurrency). Medians and means of one run each, no interval: the latency-split result beside it
carries the statistics.

    python bench/gateway_tax_summary.py latency_split.json direct nginx pygw

The names follow the targets' order (the first is the direct path). Last line: one JSON object.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any


def _tpot(p: dict[str, Any], base: dict[str, Any]) -> float:
    """Mean time per output token after the first: (E2E - TTFT) / the gaps a direct request
    streams (a gateway may coalesce chunks, so its own ITL count is no token count)."""
    gaps = base["itl_ms"]["count"] / max(1, base["num_ok"])
    return (p["e2e_ms"]["mean"] - p["ttft_ms"]["mean"]) / max(1.0, gaps)


def summarize(result: dict[str, Any], names: list[str]) -> dict[str, Any]:
    data = result["data"]
    urls = [t["url"] for t in result["target"]]
    if len(names) != len(urls):
        raise ValueError(f"{len(names)} names for {len(urls)} targets")
    name = dict(zip(urls, names, strict=True))
    points = {(name[p["target"]], p["load"]): p for p in data["points"]}
    rows = []
    for (path, load), p in sorted(points.items(), key=lambda kv: (kv[0][1], names.index(kv[0][0]))):
        base = points.get((names[0], load))
        if path == names[0] or base is None:
            continue
        engine_tpot, tpot = _tpot(base, base), _tpot(p, base)
        tpot_tax = tpot - engine_tpot
        rows.append({"path": path, "concurrency": int(load),
                     "ttft_tax_ms": round(p["ttft_ms"]["p50"] - base["ttft_ms"]["p50"], 3),
                     "tpot_tax_ms": round(tpot_tax, 3), "engine_tpot_ms": round(engine_tpot, 3),
                     "tpot_tax_share_pct": round(100 * tpot_tax / engine_tpot, 1) if engine_tpot > 0 else None,
                     "e2e_tax_ms": round(p["e2e_ms"]["p50"] - base["e2e_ms"]["p50"], 3),
                     "num_ok": p["num_ok"], "num_error": p["num_error"]})
    return {"bench": "gateway_tax", "paths": names, "model": result["target"][0].get("model"), "rows": rows}


def main() -> int:
    if len(sys.argv) < 4:
        print(__doc__.split("\n\n")[1].strip(), file=sys.stderr)
        return 2
    summary = summarize(json.loads(Path(sys.argv[1]).read_text()), sys.argv[2:])
    for r in summary["rows"]:
        share = "-" if r["tpot_tax_share_pct"] is None else f"{r['tpot_tax_share_pct']}%"
        print(f"{r['path']:>6} c={r['concurrency']:<3} TTFT p50 {r['ttft_tax_ms']:+.2f} ms; per token "
              f"{r['tpot_tax_ms']:+.3f} ms = {share} of the engine's {r['engine_tpot_ms']:.3f} ms; "
              f"E2E p50 {r['e2e_tax_ms']:+.2f} ms ({r['num_ok']} ok, {r['num_error']} errors)")
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The null engine's own Python per request and per token, in process, without HTTP.

Engine(model="null") with add_request -> step -> deliver run to completion for N requests of T
tokens (the same Engine.step, scheduler, KV bookkeeping with prefix caching, postprocess and
detokenization the server runs; no sockets, no front). Each cell is the least CPU time
(time.process_time) per request over many short rounds, so neighbours' load inflates it less
than wall time. --baseline DIR runs the same cells in another zgtool tree (e.g. an older commit:
``git archive COMMIT | tar -x -C DIR && ln -s ../engine DIR/zgtool/engine``) in a subprocess,
alternating with this tree, and prints after/before ratios.

    .venv/bin/python bench/engine_step.py [--baseline DIR] [--rounds 3]

The LAST line is one JSON object.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
import time

CELLS = ((1, 1, 20), (1, 16, 4), (32, 1, 1), (32, 16, 1))   # (concurrency, tokens, batches per round)
PROMPT = list(b"<|user|>Say something about serving.<|assistant|>" * 2)    # 98 tokens, 6 full blocks
REPEATS = 200


def _cell(eng: object, conc: int, toks: int, batches: int, repeats: int = REPEATS) -> float:
    """Least CPU us per request over `repeats` rounds of `batches` x `conc` requests."""
    from zgtool.engine.config import SamplingParams
    from zgtool.engine.drivers import deliver

    best = float("inf")
    for _ in range(repeats):
        t0 = time.process_time()
        for _ in range(batches):
            for _ in range(conc):
                eng.add_request(PROMPT, SamplingParams(max_tokens=toks, temperature=0.0))  # type: ignore[attr-defined]
            while eng._has_work():  # type: ignore[attr-defined]
                deliver(eng, eng.step())  # type: ignore[attr-defined,arg-type]
        best = min(best, (time.process_time() - t0) / (batches * conc) * 1e6)
    return best


def measure() -> dict[str, float]:
    from zgtool.engine.config import EngineConfig
    from zgtool.engine.engine import Engine

    eng = Engine(EngineConfig(model="null"))
    gc.collect()
    gc.freeze()     # as serve does (run.freeze_heap)
    for conc, toks, batches in CELLS:   # warm: the prefix cache holds the prompt, memos filled
        _cell(eng, conc, toks, batches, 5)
    out = {}
    for conc, toks, batches in CELLS:
        out[f"c{conc}_t{toks}"] = _cell(eng, conc, toks, batches)
    return out


def _in(tree: str) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": tree}
    res = subprocess.run([sys.executable, os.path.abspath(__file__), "--measure"], cwd=tree, env=env,
                         capture_output=True, text=True, check=True)
    return json.loads(res.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--baseline", help="another zgtool tree, measured alternately")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--measure", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.measure:
        print(json.dumps(measure()))
        return
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    runs: dict[str, list[dict[str, float]]] = {"zgtool": [], "baseline": []}
    for _ in range(args.rounds):
        runs["zgtool"].append(_in(here))
        if args.baseline:
            runs["baseline"].append(_in(os.path.abspath(args.baseline)))
    result: dict[str, object] = {"bench": "engine_step", "model": "null", "rounds": args.rounds}
    for system, rs in runs.items():
        if rs:
            result[system] = {k: round(min(r[k] for r in rs), 2) for k in rs[0]}
    print(f"{'cell':>10} | {'zgtool us/req':>13} {'us/token':>9}" + (" | baseline us/req  us/token | ratio" if args.baseline else ""))
    mine = result["zgtool"]
    assert isinstance(mine, dict)
    ratios = {}
    for key, us in mine.items():
        toks = int(key.split("_t")[1])
        line = f"{key:>10} | {us:13.1f} {us / toks:9.2f}"
        if args.baseline:
            base = result["baseline"][key]  # type: ignore[index]
            ratios[key] = round(us / base, 3)
            line += f" | {base:15.1f} {base / toks:9.2f} | {ratios[key]:.2f}"
        print(line)
    if ratios:
        result["ratio_after_before"] = ratios
    print(f"(least CPU time per request over {REPEATS} rounds x {args.rounds} runs; load avg {os.getloadavg()[0]:.1f})")
    print(json.dumps(result))


if __name__ == "__main__":
    main()

"""Where the fused engine's CPU per request goes, beside the uvicorn floor, in one process.

bench/serving_overhead.py compares ``zgtool serve --model null`` with a bare uvicorn app as a whole;
this cuts the same serving path at several depths and runs the engine alone, all on one uvloop loop
over bench/serving_inproc.py's stand-in connections (no sockets; every answer checked), so a step's
cost is the difference of two measured rows:

- ``floor``: the bare uvicorn app of bench/front_floors.py (a fixed JSON body), POST with the body;
- ``front``: GET /health through zgtool's protocol class and app (routing, ids, Server-Timing);
- ``count``: POST /v1/messages/count_tokens with the body of ``request``: the front plus body
  intake, JSON parse and validation, admission, the chat template and a JSON answer; no engine
  (shown for scale: its handler is not the generation flow's, so no step is derived from it);
- ``request``: POST /v1/messages, one output token: everything;
- ``engine``: the same engine with the same prompt, ``add_request -> step -> deliver``, no HTTP
  (a JSON answer's request, ``whole_answer=True``, as the ``request`` row's handler adds it);
- ``engine16``: the same with 16 output tokens (each a step of its own), so that
  ``(engine16 - engine) / 15`` is what the engine's own Python costs per further token.

Derived per concurrency: front - floor (what our front costs over uvicorn's own) and request -
front, which is the engine plus the rest (body intake, parse and validation, chat template,
admission, flight, answer body, Server-Timing, metrics), and the engine's cost per output token. Each row's figure is process CPU
microseconds per request, the least of ``--rounds`` rounds; per round the rows run one after
another, rotating who goes first.

    .venv/bin/python bench/serving_breakdown.py [--requests 8000] [--rounds 3] [--concurrency 1,32]

The LAST line is one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from front_floors import floor_app  # noqa: E402
from peerlib.machine import cpu_model  # noqa: E402
from serving_inproc import drive, null_server, start_serving  # noqa: E402

MESSAGES = [{"role": "user", "content": "Say something about serving."}]   # serving_inproc's request
ROWS = ("floor", "front", "count", "request", "engine", "engine16")
ENGINE_TOKENS = {"engine": 1, "engine16": 16}


def _post(path: bytes, body: bytes) -> bytes:
    return (b"POST %s HTTP/1.1\r\nHost: 127.0.0.1:8000\r\ncontent-type: application/json\r\n"
            b"content-length: %d\r\n\r\n%s" % (path, len(body), body))


def requests() -> dict[str, bytes]:
    """Each HTTP row's request bytes (the engine row sends none)."""
    body = json.dumps({"model": "null", "max_tokens": 1, "stream": False, "messages": MESSAGES}).encode()
    return {"floor": _post(b"/v1/messages", body),
            "front": b"GET /health HTTP/1.1\r\nHost: 127.0.0.1:8000\r\n\r\n",
            "count": _post(b"/v1/messages/count_tokens", body),
            "request": _post(b"/v1/messages", body)}


def engine_cell(engine: Any, prompt: list[int], concurrency: int, requests: int, tokens: int = 1) -> float:
    """CPU microseconds per request of the engine alone: ``concurrency`` requests of ``tokens`` output
    tokens added, stepped to the end and delivered, until ``requests`` are done (as serve's loop steps
    them, minus HTTP; as a JSON answer's: one delta each, at the end)."""
    from zgtool.engine.config import SamplingParams
    from zgtool.engine.drivers import deliver

    params = SamplingParams(max_tokens=tokens, temperature=0.0)
    done = 0
    t0 = time.process_time()
    while done < requests:
        n = min(concurrency, requests - done)
        streams = [engine.add_request(prompt, params, whole_answer=True) for _ in range(n)]
        while engine._has_work():
            deliver(engine, engine.step())
        if not all(s.finish_reason == "length" and len(s.output_token_ids) == tokens for s in streams):
            raise SystemExit(f"the engine did not finish every request with its {tokens} tokens")
        done += n
    return (time.process_time() - t0) / requests * 1e6


def derive(row: dict[str, float]) -> dict[str, float]:
    """The steps between the rows of one concurrency, microseconds per request."""
    past_front = row["request"] - row["front"]
    return {"front_over_floor": row["front"] - row["floor"], "request_over_front": past_front,
            "engine": row["engine"], "rest": past_front - row["engine"],
            "engine_per_token": (row["engine16"] - row["engine"]) / 15}


def measure(concurrencies: list[int], requests_n: int, rounds: int) -> dict[int, dict[str, float]]:
    import uvloop
    from uvicorn.config import Config
    from uvicorn.server import ServerState

    from zgtool.engine.server.run import freeze_heap

    logging.disable(logging.WARNING)
    built, server = null_server()
    floor_cfg = Config(floor_app, http="httptools", loop="uvloop", lifespan="off", access_log=False)
    floor_cfg.load()
    floor_state = ServerState()
    prompt = built.engine.tokenizer.apply_chat_template(messages=MESSAGES)
    raws = requests()
    freeze_heap()
    best: dict[int, dict[str, float]] = {c: dict.fromkeys(ROWS, float("inf")) for c in concurrencies}

    async def go() -> None:
        loop = asyncio.get_running_loop()
        zg = start_serving(built, server, loop)

        def floor() -> Any:
            return floor_cfg.http_protocol_class(config=floor_cfg, server_state=floor_state, app_state={},
                                                 _loop=loop)

        async def cell(row: str, c: int, n: int) -> float:
            if row in ENGINE_TOKENS:
                return engine_cell(built.engine, prompt, c, n, ENGINE_TOKENS[row])
            return await drive(floor if row == "floor" else zg, raws[row], False, c, n)

        for c in concurrencies:
            for row in ROWS:                    # warm up: memos, the prefix cache, the allocator
                await cell(row, c, max(c, requests_n // 10))
            for r in range(rounds):
                order = ROWS[r % len(ROWS):] + ROWS[:r % len(ROWS)]
                for row in order:
                    best[c][row] = min(best[c][row], await cell(row, c, requests_n))
        await built.engine.shutdown(1.0)

    uvloop.run(go())
    built.sock.close()
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=8000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--concurrency", default="1,32")
    args = ap.parse_args()
    concurrencies = [int(x) for x in args.concurrency.split(",")]
    best = measure(concurrencies, args.requests, args.rounds)
    print(f"{'conc':>4} | " + " | ".join(f"{r:>8} us" for r in ROWS) + " | request/floor")
    for c, row in best.items():
        print(f"{c:>4} | " + " | ".join(f"{row[r]:11.1f}" for r in ROWS) + f" | {row['request'] / row['floor']:.2f}x")
    print("\nsteps (us per request): front - floor | request - front = engine + rest | engine per further token")
    steps = {c: derive(row) for c, row in best.items()}
    for c, s in steps.items():
        print(f"c={c:<3} {s['front_over_floor']:+8.1f} | {s['request_over_front']:8.1f} = "
              f"{s['engine']:.1f} + {s['rest']:.1f} | {s['engine_per_token']:.2f}")
    print(json.dumps({"bench": "serving_breakdown", "model": "null", "cpu": cpu_model(),
                      "cpu_us_per_req": {f"c{c}": {k: round(v, 2) for k, v in row.items()} for c, row in best.items()},
                      "ratio_to_floor": {f"c{c}": {k: round(v / row["floor"], 3) for k, v in row.items()}
                                         for c, row in best.items()},
                      "steps_us": {f"c{c}": {k: round(v, 2) for k, v in s.items()} for c, s in steps.items()}}))


if __name__ == "__main__":
    main()

"""bench/serving_breakdown.py end to end: every row of every concurrency measured (each HTTP answer
checked by serving_inproc's stand-in client, each engine request run to its length), and the steps
it prints are the differences of the rows it measured."""

from __future__ import annotations

import sys

import pytest
from bench_run import ROOT, run_bench


def test_serving_breakdown_measures_every_row_and_derives_the_steps_from_them() -> None:
    result = run_bench("serving_breakdown.py", "--requests", "120", "--rounds", "1", "--concurrency", "1,4")
    assert result["bench"] == "serving_breakdown" and result["cpu"] and result["cpu"] != "unknown"
    rows = result["cpu_us_per_req"]
    assert set(rows) == {"c1", "c4"}
    for c, row in rows.items():
        assert set(row) == {"floor", "front", "count", "request", "engine", "engine16"}
        assert all(v > 0 for v in row.values())
        steps = result["steps_us"][c]
        assert steps["front_over_floor"] == pytest.approx(row["front"] - row["floor"], abs=0.02)
        assert steps["request_over_front"] == pytest.approx(row["request"] - row["front"], abs=0.02)
        assert steps["engine"] == row["engine"]
        assert steps["rest"] == pytest.approx(row["request"] - row["front"] - row["engine"], abs=0.03)
        assert steps["engine_per_token"] == pytest.approx((row["engine16"] - row["engine"]) / 15, abs=0.01)
        assert result["ratio_to_floor"][c]["request"] == pytest.approx(row["request"] / row["floor"], abs=0.002)


def test_the_engine_row_fails_loudly_when_a_request_does_not_finish() -> None:
    sys.path.insert(0, str(ROOT / "bench"))
    from serving_breakdown import engine_cell

    from zgtool.engine.config import EngineConfig
    from zgtool.engine.engine import Engine

    class Unfinished:
        finish_reason = None
        output_token_ids: list[int] = []

    class Stuck:
        """An engine whose requests never finish: add_request hands back a stream with no reason."""

        def add_request(self, prompt: list[int], params: object, whole_answer: bool = False) -> Unfinished:
            return Unfinished()

        def _has_work(self) -> bool:
            return False

    with pytest.raises(SystemExit, match="did not finish"):
        engine_cell(Stuck(), [1, 2, 3], 2, 4)
    eng = Engine(EngineConfig(model="null"))
    prompt = eng.tokenizer.apply_chat_template(messages=[{"role": "user", "content": "hi"}])
    assert engine_cell(eng, prompt, 3, 7) > 0
    assert engine_cell(eng, prompt, 3, 7, tokens=16) > 0      # each request runs to its 16 tokens


def test_the_engine_rows_ask_for_one_and_sixteen_tokens() -> None:
    sys.path.insert(0, str(ROOT / "bench"))
    from serving_breakdown import ENGINE_TOKENS, ROWS

    assert ENGINE_TOKENS == {"engine": 1, "engine16": 16} and set(ENGINE_TOKENS) <= set(ROWS)

"""Non-finite logits fail the requests they belong to with an engine error naming where the first
non-finite value appeared ("non-finite logits in layer N"), never a token 0 (issue 26), on every
compute backend: the C kernels (fp32 and bf16 weights), torch alone, int8; greedy (the C
lm_head+argmax) and sampled."""

from __future__ import annotations

import pytest
import torch

from zgtool.engine import Engine, EngineConfig, SamplingParams
from zgtool.engine.quant import Int8Weight

PROMPTS = [[256, 5, 6, 7], [256, 8, 9, 10, 11, 12], [256, 13, 99, 14], [256, 15]]


@pytest.fixture(params=["kernels-float32", "torch-float32", "kernels-int8", "kernels-bfloat16"])
def engine(request, monkeypatch) -> Engine:
    backend, dtype = request.param.split("-")
    if backend == "torch":
        monkeypatch.setenv("ZGTOOL_NO_KERNELS", "1")
    else:
        monkeypatch.delenv("ZGTOOL_NO_KERNELS", raising=False)
    return Engine(EngineConfig(model="dummy:tiny", dtype=dtype, device="cpu", block_size=8))


def _poison(w: object) -> None:
    with torch.no_grad():
        (w.scale if isinstance(w, Int8Weight) else w).fill_(float("nan"))  # type: ignore[union-attr]


def _run(engine: Engine, params: SamplingParams) -> tuple[dict[str, list[int]], dict[str, str | None]]:
    for i, p in enumerate(PROMPTS):
        engine.add_request(p, params, request_id=f"r{i}")
    tokens: dict[str, list[int]] = {}
    errors: dict[str, str | None] = {}
    while engine._has_work():
        for out in engine.step():
            tokens.setdefault(out.request_id, []).extend(out.token_ids)
            if out.finished:
                errors[out.request_id] = out.error
    return tokens, errors


PARAMS = {"greedy": SamplingParams(max_tokens=6, temperature=0, ignore_eos=True),
          "sampled": SamplingParams(max_tokens=6, temperature=0.8, seed=1, ignore_eos=True)}


@pytest.mark.parametrize("mode", sorted(PARAMS))
def test_a_nan_weight_in_layer_1_fails_every_request_naming_layer_1(engine, mode, caplog) -> None:
    _poison(engine.model.layers[1].down)
    tokens, errors = _run(engine, PARAMS[mode])
    assert set(errors) == {f"r{i}" for i in range(len(PROMPTS))}
    assert all(err is not None for err in errors.values()), errors
    assert all(tokens.get(r, []) == [] for r in errors), tokens  # no token 0 (nor any token) was emitted
    assert "non-finite logits in layer 1" in caplog.text


@pytest.mark.parametrize("mode", sorted(PARAMS))
def test_a_nan_embedding_row_fails_only_the_request_that_uses_that_token(engine, mode, caplog) -> None:
    reference = Engine(EngineConfig(model="dummy:tiny", dtype=engine.config.dtype, device="cpu", block_size=8))
    ref_tokens, _ = _run(reference, PARAMS[mode])
    with torch.no_grad():
        engine.model.embed[99].fill_(float("nan"))  # only PROMPTS[2] contains token 99
    tokens, errors = _run(engine, PARAMS[mode])
    assert errors["r2"] is not None and tokens.get("r2", []) == []
    assert "non-finite logits in the embedding" in caplog.text
    for r in ("r0", "r1", "r3"):
        assert errors[r] is None and tokens[r] == ref_tokens[r], r

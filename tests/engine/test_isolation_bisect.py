"""An unattributed step failure is pinned on its sequences by bisection (engine/faults.py):
two poisoned requests in a batch of 16 fail, the 14 others finish as if they were alone, in
fewer trial runs than one per sequence; a fault that needs the whole batch fails only that step's
sequences."""

from __future__ import annotations

from zgtool.engine import Engine, EngineConfig, SamplingParams

GREEDY = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True)


def _engine() -> Engine:
    return Engine(EngineConfig(model="dummy:tiny", dtype="float32", device="cpu", block_size=8))


def _run(engine: Engine, n: int, fails) -> tuple[dict, dict, list[int]]:  # noqa: ANN001
    real = engine.runner.execute
    sizes: list[int] = []

    def execute(batch):  # noqa: ANN001, ANN202
        sizes.append(len(batch.seqs))
        if fails(batch):
            raise ValueError("boom")
        return real(batch)

    engine.runner.execute = execute  # type: ignore[method-assign]
    tokens: dict[str, list[int]] = {}
    errors: dict[str, str | None] = {}
    for i in range(n):
        engine.add_request([256, *range(3 + i, 8 + i)], GREEDY, request_id=f"p{i}")
    while engine._has_work():
        for out in engine.step():
            tokens.setdefault(out.request_id, []).extend(out.token_ids)
            if out.finished:
                errors[out.request_id] = out.error
    return tokens, errors, sizes


def test_two_poisoned_requests_of_16_fail_alone_found_by_bisection():
    ref, _, _ = _run(_engine(), 16, lambda b: False)
    engine = _engine()
    poisoned = {"p3", "p12"}
    tokens, errors, sizes = _run(engine, 16, lambda b: any(s.request_id in poisoned for s in b.seqs))
    assert {r for r, e in errors.items() if e} == poisoned
    assert errors["p3"] == "internal engine error (request p3)"
    for i in range(16):
        if f"p{i}" not in poisoned:
            assert tokens[f"p{i}"] == ref[f"p{i}"], i
    trials = sizes[1:sizes.index(14)]       # between the failed step and the next (the 14 left)
    assert 0 < len(trials) < 16, f"bisection, not one run per sequence: {trials}"
    assert all(c == 0 for c in engine.block_manager.ref_cnt)


def test_a_fault_that_needs_the_whole_batch_fails_that_steps_sequences_only():
    engine = _engine()
    engine.add_request([256, 40, 41], SamplingParams(max_tokens=3, temperature=0), request_id="w0")
    engine.step()   # w0 runs
    state = {"armed": True}
    real = engine.runner.execute

    def execute(batch):  # noqa: ANN001, ANN202
        if state["armed"] and len(batch.seqs) == 3:
            state["armed"] = False
            raise ValueError("only together")
        return real(batch)

    engine.runner.execute = execute  # type: ignore[method-assign]
    engine.add_request([256, 50, 51], GREEDY, request_id="a")
    engine.add_request([256, 60, 61], GREEDY, request_id="b")
    outs = engine.step()
    assert sorted(o.request_id for o in outs if o.error) == ["a", "b", "w0"]
    assert not engine.scheduler.has_work and all(c == 0 for c in engine.block_manager.ref_cnt)


class OutOfMemoryError(RuntimeError):
    """Named like torch.OutOfMemoryError (a RuntimeError): matched by name, no torch needed."""


def test_out_of_memory_is_engine_wide_and_fails_everyone_not_one_request():
    from zgtool.engine.faults import is_engine_wide

    assert is_engine_wide(MemoryError()) and is_engine_wide(OutOfMemoryError("CUDA out of memory"))
    assert not is_engine_wide(RuntimeError("multinomial")) and not is_engine_wide(ZeroDivisionError())
    engine = _engine()

    def execute(batch):  # noqa: ANN001, ANN202
        raise OutOfMemoryError("CUDA out of memory")

    engine.runner.execute = execute  # type: ignore[method-assign]
    for i in range(3):
        engine.add_request([256, 5 + i, 6], GREEDY, request_id=f"m{i}")
    try:
        engine.step()
    except OutOfMemoryError as exc:     # the step thread (_run) hands this to faults.fail_everyone
        outs = engine.faults.fail_everyone(exc)
    else:
        raise AssertionError("an out-of-memory step was pinned on a request")
    assert sorted(o.request_id for o in outs) == ["m0", "m1", "m2"]
    assert all(o.error == f"internal engine error (request {o.request_id})" for o in outs)
    assert all(c == 0 for c in engine.block_manager.ref_cnt)

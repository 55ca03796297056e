"""Prompt chunks on the C kernels (engine/model.py: every token row one query over its own
sequence's paged KV, the whole step in one C call): the per-row attention equals causal SDPA and
reads nothing past a row's own position, and because rows never mix, a prompt's hidden states
are the same to the bit whether it runs whole, in chunks, after a cached prefix or token by token."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from zgtool.engine import Engine, EngineConfig
from zgtool.engine.cpu_kernels import cpu_has_avx2_fma, paged_decode_attention
from zgtool.engine.model import build_attn_meta

pytestmark = pytest.mark.skipif(not cpu_has_avx2_fma(), reason="the kernels need AVX2 + FMA")

BS = 4


def _slots(table: list[int], positions: range) -> list[int]:
    return [table[p // BS] * BS + p % BS for p in positions]


def _causal_reference(q: torch.Tensor, kc: torch.Tensor, vc: torch.Tensor, table: list[int], start: int,
                      scale: float) -> torch.Tensor:
    """SDPA over the gathered context with a causal mask offset by the cached prefix."""
    n = q.shape[0]
    ctx = start + n
    slots = torch.tensor(_slots(table, range(ctx)))
    kk, vv = kc[slots].transpose(0, 1)[None], vc[slots].transpose(0, 1)[None]
    mask = torch.arange(ctx)[None, :] <= torch.arange(start, ctx)[:, None]
    out = F.scaled_dot_product_attention(q.transpose(0, 1)[None], kk, vv, attn_mask=mask, enable_gqa=True, scale=scale)
    return out[0].transpose(0, 1)


@pytest.mark.parametrize(("start", "n"), [(0, 1), (0, 13), (6, 7), (16, 9)])
def test_prompt_chunk_rows_attend_causally_like_sdpa(start: int, n: int) -> None:
    g = torch.Generator().manual_seed(start * 100 + n)
    heads, kv_heads, d = 6, 2, 16
    kc, vc = torch.randn(40 * BS, kv_heads, d, generator=g), torch.randn(40 * BS, kv_heads, d, generator=g)
    table = torch.randperm(40, generator=g)[:12].tolist()
    meta = build_attn_meta(list(range(start, start + n)), _slots(table, range(start, start + n)), [], [], [],
                           [(0, n, table, start)], BS, torch.device("cpu"))
    assert meta.row_tables is not None and meta.row_ctx is not None and meta.rows_on_kernel
    assert meta.row_ctx.tolist() == list(range(start + 1, start + n + 1))
    q = torch.randn(n, heads, d, generator=g) * 2
    got = paged_decode_attention(q, kc, vc, meta.row_tables, meta.row_ctx, BS, d ** -0.5)
    torch.testing.assert_close(got, _causal_reference(q, kc, vc, table, start, d ** -0.5), rtol=1e-5, atol=1e-5)


def test_a_prompt_row_reads_nothing_past_its_own_position() -> None:
    g = torch.Generator().manual_seed(3)
    heads, kv_heads, d, start, n = 4, 2, 8, 5, 10
    kc, vc = torch.randn(16 * BS, kv_heads, d, generator=g), torch.randn(16 * BS, kv_heads, d, generator=g)
    table = [9, 2, 14, 7, 11, 3, 0]   # ctx 15 covers 4 blocks; the rest of the table is never read
    meta = build_attn_meta(list(range(start, start + n)), _slots(table, range(start, start + n)), [], [], [],
                           [(0, n, table, start)], BS, torch.device("cpu"))
    assert meta.row_tables is not None and meta.row_ctx is not None
    q = torch.randn(n, heads, d, generator=g)
    want = paged_decode_attention(q, kc, vc, meta.row_tables, meta.row_ctx, BS, 0.3)
    for j in range(n):
        k2, v2 = kc.clone(), vc.clone()
        own = set(_slots(table, range(start + j + 1)))
        later = [s for s in range(k2.shape[0]) if s not in own]   # later rows' positions, other blocks, padding
        k2[later], v2[later] = float("nan"), float("nan")
        got = paged_decode_attention(q, k2, v2, meta.row_tables, meta.row_ctx, BS, 0.3)
        assert torch.equal(got[j], want[j]), j


def test_decodes_and_prompt_chunks_share_one_per_row_table() -> None:
    """A mixed step (two decodes, two prompt chunks, one after a cached prefix): each row gets its
    own sequence's table and its own position + 1 as context."""
    tables = [[3, 1], [5], [0, 2, 4], [6, 7]]
    positions = [5, 2, 0, 1, 2, 4, 5, 6]      # decode at 5, decode at 2, chunk 0..2, chunk 4..6
    dec_idx, dec_tables, dec_lens = [0, 1], tables[:2], [6, 3]
    prefills = [(2, 5, tables[2], 0), (5, 8, tables[3], 4)]
    slots = [tables[0][1] * BS + 1, tables[1][0] * BS + 2, *_slots(tables[2], range(3)), *_slots(tables[3], range(4, 7))]
    meta = build_attn_meta(positions, slots, dec_idx, dec_tables, dec_lens, prefills, BS, torch.device("cpu"))
    assert meta.row_ctx is not None and meta.row_tables is not None
    assert meta.row_ctx.tolist() == [6, 3, 1, 2, 3, 5, 6, 7]
    rows = meta.row_tables.tolist()
    assert [r[:2] for r in rows] == [[3, 1], [5, 0], [0, 0], [0, 0], [0, 0], [6, 7], [6, 7], [6, 7]]


def _hidden_last(engine: Engine, ids: list[int], chunks: list[int]) -> torch.Tensor:
    """The final hidden state of the prompt's last row, the prompt run in the given chunk sizes
    (a chunk of 1 after the first is a decode row), on fresh blocks of the engine's pool."""
    model = engine.model
    assert model is not None
    table = list(range(-(-len(ids) // BS)))
    start, out = 0, None
    for n in chunks:
        pos = range(start, start + n)
        if start > 0 and n == 1:
            meta = build_attn_meta([start], _slots(table, pos), [0], [table], [start + 1], [], BS, torch.device("cpu"))
        else:
            meta = build_attn_meta(list(pos), _slots(table, pos), [], [], [], [(0, n, table, start)], BS,
                                   torch.device("cpu"))
        out = model.forward(torch.tensor(ids[start:start + n]), meta)
        start += n
    assert out is not None and start == len(ids)
    return out[-1].clone()


@pytest.mark.parametrize("dtype", ["float32", "int8"])
@pytest.mark.parametrize("fused", [True, False])
def test_a_prompts_hidden_state_is_the_same_whole_chunked_or_token_by_token(dtype: str, fused: bool) -> None:
    e = Engine(EngineConfig(model="dummy:tiny", dtype=dtype, device="cpu", block_size=BS, enable_prefix_caching=False))
    assert e.model is not None
    e.model.fused_layers = fused
    ids = [256, *range(300, 337)]
    whole = _hidden_last(e, ids, [len(ids)])
    assert torch.equal(_hidden_last(e, ids, [16, 22]), whole)            # a cached prefix of 4 blocks
    assert torch.equal(_hidden_last(e, ids, [5, 11, 1, 21]), whole)      # chunks not on block edges
    assert torch.equal(_hidden_last(e, ids, [1] * len(ids)), whole)      # decode rows, one at a time


def test_long_prompt_chunks_take_sdpa_and_agree_with_the_per_row_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    import zgtool.engine.model as model_mod

    e = Engine(EngineConfig(model="dummy:tiny", dtype="float32", device="cpu", block_size=BS,
                            enable_prefix_caching=False))
    ids = [256, *range(300, 360)]
    kernel = _hidden_last(e, ids, [20, 41])
    import zgtool.engine.attention as attention_mod

    monkeypatch.setattr(attention_mod, "PREFILL_KERNEL_WORK", 10)   # every chunk too large: SDPA over the gather
    calls = {"one_call": 0}
    real = model_mod.LlamaModel._layers_one_call

    def counting(self: object, x: torch.Tensor, meta: object) -> torch.Tensor:
        calls["one_call"] += 1
        return real(self, x, meta)  # type: ignore[arg-type]

    monkeypatch.setattr(model_mod.LlamaModel, "_layers_one_call", counting)
    torch.testing.assert_close(_hidden_last(e, ids, [20, 41]), kernel, rtol=1e-5, atol=1e-5)
    assert calls["one_call"] == 0

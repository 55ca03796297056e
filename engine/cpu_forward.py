"""The C-kernel step glue of a CPU LlamaModel (engine/model.py): the pointer table of every
layer's weights and KV (rebuilt when the KV pool is), the step_layers argument struct
(engine/csrc/zg_kernels.h step_args), the grow-only scratch buffers, greedy sampling's
lm_head + argmax and the non-finite checks over the logits. Every tensor whose pointer goes into
a struct is checked first (dtype, CPU, contiguous, size): the C side reads dense arrays with no
length to check against, so a wrong tensor would read the wrong memory (issue 26's NaN logits
came from a scale table shorter than a GEMM's outputs).

CpuStep reads its model through StepModel, a Protocol of exactly what it uses (LlamaModel satisfies
it), so this module does not import engine/model.py, which builds a CpuStep at load time."""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

import torch

from zgtool.engine import cpu_kernels as ck
from zgtool.engine.quant import Int8Weight

if TYPE_CHECKING:
    from zgtool.engine.attention import AttnMeta
    from zgtool.engine.backends import GreedyArgs
    from zgtool.engine.presets import ModelSpec

# the torch dtype of each weight element step_layers takes (ZG_W_* in zg_kernels.h)
WEIGHT_DTYPES = {ck.W_F32: torch.float32, ck.W_BF16: torch.bfloat16, ck.W_INT8: torch.int8, ck.W_INT8A8: torch.int8}


class StepLayer(Protocol):
    """What CpuStep reads of one decoder layer (engine/model.py's LayerWeights), read-only."""

    @property
    def input_norm(self) -> torch.Tensor: ...
    @property
    def post_norm(self) -> torch.Tensor: ...
    @property
    def qkv(self) -> torch.Tensor | Int8Weight: ...
    @property
    def qkv_bias(self) -> torch.Tensor | None: ...
    @property
    def o(self) -> torch.Tensor | Int8Weight: ...
    @property
    def gate_up(self) -> torch.Tensor | Int8Weight: ...
    @property
    def down(self) -> torch.Tensor | Int8Weight: ...


class StepModel(Protocol):
    """What CpuStep reads of its model (engine/model.py's LlamaModel), read-only."""

    @property
    def spec(self) -> ModelSpec: ...
    @property
    def device(self) -> torch.device: ...
    @property
    def num_heads(self) -> int: ...
    @property
    def num_kv_heads(self) -> int: ...
    @property
    def head_dim(self) -> int: ...
    @property
    def scale(self) -> float: ...
    @property
    def layers(self) -> Sequence[StepLayer]: ...
    @property
    def norm(self) -> torch.Tensor: ...
    @property
    def cos(self) -> torch.Tensor: ...
    @property
    def sin_signed(self) -> torch.Tensor: ...
    @property
    def k_cache(self) -> Sequence[torch.Tensor]: ...
    @property
    def v_cache(self) -> Sequence[torch.Tensor]: ...
    @property
    def block_size(self) -> int: ...
    @property
    def _kv_generation(self) -> int: ...  # bumped when the KV pool is (re)allocated
    @property
    def _lm_ones(self) -> torch.Tensor | None: ...  # f32_gemm's all-ones per-channel scales


class CpuStep:
    """One CPU model's step glue around the C kernels (one per LlamaModel)."""

    def __init__(self, model: StepModel, wtype: int) -> None:
        self.m = model
        self.wtype = wtype  # the projections' weight element: ck.W_F32 | W_BF16 | W_INT8
        self.scratch: dict[str, torch.Tensor] = {}  # grow-only step buffers
        self._tokens = torch.empty(64, dtype=torch.long)  # greedy_tokens' output, grow-only
        self._argmax_shape = (0, 0)  # (rows, vocab) of the last greedy_tokens call
        self._ptrs: ctypes.Array[ck.LayerPtrs] | None = None
        self._ptrs_key = -1

    def buf(self, name: str, n: int) -> torch.Tensor:
        """A grow-only fp32 scratch buffer of at least n elements (valid until the next step)."""
        buf = self.scratch.get(name)
        if buf is None or buf.numel() < n:
            buf = self.scratch[name] = torch.empty(max(n, 2 * (0 if buf is None else buf.numel())),
                                                   dtype=torch.float32, device=self.m.device)
        return buf

    def _weight(self, name: str, w: object, ones: torch.Tensor | None) -> tuple[int, int]:
        """(weights, per-channel scales) pointers of one projection, checked: the step's weight
        element, contiguous on the CPU, and a scale per output channel."""
        if isinstance(w, Int8Weight):
            t, scale = w.q, w.scale
        else:
            assert isinstance(w, torch.Tensor) and ones is not None
            t, scale = w, ones
        ck._need("step_layers", name, t, WEIGHT_DTYPES[self.wtype], (None, None))
        ck._need("step_layers", f"{name} scale", scale, torch.float32, (None,))
        if scale.numel() < t.shape[0]:
            raise ck.KernelArgumentError(f"step_layers: {name} [{t.shape[0]}, ...] {t.dtype} with "
                                         f"{scale.numel()} scales (needs one per output channel)")
        return t.data_ptr(), scale.data_ptr()

    def layer_ptrs(self) -> ctypes.Array[ck.LayerPtrs]:
        """The ctypes array of every layer's weight and KV pointers, rebuilt when the KV pool is
        (re)allocated."""
        m = self.m
        key = m._kv_generation
        if self._ptrs_key == key and self._ptrs is not None:
            return self._ptrs
        ones = m._lm_ones
        hid, d, nkv = m.spec.hidden_size, m.head_dim, m.num_kv_heads
        arr = (ck.LayerPtrs * len(m.layers))()
        for i, lw in enumerate(m.layers):
            qkv, qkv_s = self._weight("qkv", lw.qkv, ones)
            o, o_s = self._weight("o", lw.o, ones)
            gu, gu_s = self._weight("gate_up", lw.gate_up, ones)
            dn, dn_s = self._weight("down", lw.down, ones)
            for name, t in (("input_norm", lw.input_norm), ("post_norm", lw.post_norm)):
                ck._need("step_layers", name, t, torch.float32, (hid,))
            if lw.qkv_bias is not None:
                ck._need("step_layers", "qkv_bias", lw.qkv_bias, torch.float32, (None,))
            ck._need("step_layers", "k_cache", m.k_cache[i], torch.float32, (None, nkv, d))
            ck._need("step_layers", "v_cache", m.v_cache[i], torch.float32, tuple(m.k_cache[i].shape))
            arr[i] = ck.LayerPtrs(lw.input_norm.data_ptr(), lw.post_norm.data_ptr(), qkv, qkv_s,
                                  None if lw.qkv_bias is None else lw.qkv_bias.data_ptr(), o, o_s, gu, gu_s, dn, dn_s,
                                  m.k_cache[i].data_ptr(), m.v_cache[i].data_ptr())
        self._ptrs, self._ptrs_key = arr, key
        return arr

    def step_args(self, x: torch.Tensor, meta: AttnMeta) -> tuple[torch.Tensor, ck.StepArgs]:
        """step_layers' output tensor and argument struct: pointers into x, meta, the weights and
        the grow-only scratch buffers (valid until the next step), each tensor checked."""
        m = self.m
        assert meta.row_ctx is not None and meta.row_tables is not None
        rows, hid = x.shape
        nh, nkv, d, inter = m.num_heads, m.num_kv_heads, m.head_dim, m.spec.intermediate_size
        tables = meta.row_tables
        name = "step_layers"
        ck._need(name, "x", x, torch.float32, (None, m.spec.hidden_size))
        ck._need(name, "tables", tables, torch.int64, (rows, None))
        for what, t in (("positions", meta.positions), ("slots", meta.slot_mapping), ("lens", meta.row_ctx)):
            ck._need(name, what, t, torch.int64, (rows,))
        ck._need(name, "cos", m.cos, torch.float32, (None, d))
        ck._need(name, "sin", m.sin_signed, torch.float32, tuple(m.cos.shape))
        ck._need(name, "final_norm", m.norm, torch.float32, (hid,))
        width = int(tables.shape[1])
        nt = torch.get_num_threads()
        out = torch.empty_like(x)
        b = self.buf
        scratch = b("attn", max(1, nt * nh // nkv * width * m.block_size))
        ptrs = self.layer_ptrs()
        args = ck.StepArgs(
            layers=ctypes.addressof(ptrs), nl=len(m.layers), wtype=self.wtype, x=x.data_ptr(), M=rows,
            hidden=hid, H=nh, KVH=nkv, D=d, inter=inter, eps=m.spec.rms_norm_eps, final_norm=m.norm.data_ptr(),
            out=out.data_ptr(), cos_t=m.cos.data_ptr(), sin_t=m.sin_signed.data_ptr(),
            positions=meta.positions.data_ptr(), slots=meta.slot_mapping.data_ptr(), tables=tables.data_ptr(),
            width=width, lens=meta.row_ctx.data_ptr(), bs=m.block_size, scale=m.scale,
            h=b("h", rows * hid).data_ptr(), qkv=b("qkv", rows * (nh + 2 * nkv) * d).data_ptr(),
            q=b("q", rows * nh * d).data_ptr(), att=b("att", rows * nh * d).data_ptr(),
            gu=b("gu", rows * 2 * inter).data_ptr(), act=b("act", rows * inter).data_ptr(),
            delta=b("delta", rows * hid).data_ptr(), attn_scratch=scratch.data_ptr(), nt=nt)
        return out, args

    def layers_one_call(self, x: torch.Tensor, meta: AttnMeta) -> torch.Tensor:
        """A step's layers in one C call, decodes and short prompt chunks alike (each row attends
        over its own context): the kernels and order of the per-layer path, bit-identical to it."""
        out, args = self.step_args(x.contiguous(), meta)
        ck.library().step_layers(ctypes.addressof(args))  # args outlives the call
        return out

    def greedy_tokens(self, hidden: torch.Tensor, g: GreedyArgs) -> list[int]:
        """Each row's argmax token of the lm_head over hidden: the GEMM and the argmax in one C call."""
        rows, hid = hidden.shape
        vocab = int(g.weight.shape[0])
        hidden = hidden.contiguous()
        ck._need("lm_head_argmax", "hidden", hidden, torch.float32, (None, None))
        ck._need("lm_head_argmax", "weight", g.weight, WEIGHT_DTYPES[g.wtype], (None, hid))
        ck._need("lm_head_argmax", "scale", g.scale, torch.float32, (None,))
        if g.scale.numel() < vocab:
            raise ck.KernelArgumentError(f"lm_head_argmax: {g.scale.numel()} scales for a vocabulary of {vocab}")
        toks = self._tokens
        if toks.numel() < rows:
            toks = self._tokens = torch.empty(2 * rows, dtype=torch.long)
        ck.library().lm_head_argmax(hidden.data_ptr(), rows, hid, g.weight.data_ptr(), g.scale.data_ptr(), g.wtype,
                                    self.buf("logits", rows * vocab).data_ptr(), vocab, toks.data_ptr(),
                                    torch.get_num_threads())
        self._argmax_shape = (rows, vocab)
        return toks[:rows].tolist()

    def nonfinite_greedy_rows(self) -> list[int]:
        """Rows of the last greedy_tokens call whose logits were not all finite: one C pass over the
        logits buffer."""
        rows, vocab = self._argmax_shape
        return ck.nonfinite_rows(self.scratch["logits"][:rows * vocab].view(rows, vocab))


"""The step's last stage: what the sampled tokens mean for each request (plain Python, no torch).

Per sequence of a step, in this order: timing and KV bookkeeping (computed tokens, prefix-cache
registration), EOS, incremental detokenization, the safety filter, stop strings, the length
cap, then the delta the client may see (none before the last for a reader that wants the whole
answer and has no filter or stop strings: ``Sequence.whole_answer``). The order is the safety
contract (issue 22): the output filter sees every character before a stop string can cut it, so a
stop inside denied text ends
as content_filter (never "Pa" of a denied "Paris" answered to stop ["ris"], never a stop that
says yes or no about blocked text), and text the filter still holds is never released.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from time import perf_counter

from zgtool.engine.block_manager import BlockManager
from zgtool.engine.detok import detokenize_step, emittable, find_stop
from zgtool.engine.faults import is_engine_wide
from zgtool.engine.outputs import RequestOutput
from zgtool.engine.scheduler import ScheduledBatch
from zgtool.engine.sequence import Sequence
from zgtool.engine.tokenizer import Tokenizer

log = logging.getLogger("zgtool.engine")


class Postprocessor:
    """Turns one step's sampled tokens into RequestOutputs; ``finish(seq, reason)`` ends a request."""

    def __init__(self, tokenizer: Tokenizer, eos_token_ids: Iterable[int], block_manager: BlockManager,
                 finish: Callable[[Sequence, str], None],
                 fail: Callable[[list[Sequence]], list[RequestOutput]]) -> None:
        self.tokenizer = tokenizer
        self.eos_token_ids = set(eos_token_ids)
        self.block_manager = block_manager
        self.finish = finish
        self.fail = fail    # a request whose own text or filter raised fails alone
        self.one_text: dict[int, str] = {}  # decode([id]) memo for detokenize_step
        self.two_text: dict[tuple[int, int], str] = {}  # (prefix id, new id) -> the new text, for detokenize_step

    def __call__(self, batch: ScheduledBatch, sampled: list[int | None], step_ms: float) -> list[RequestOutput]:
        seqs = batch.seqs
        if len(sampled) != len(seqs) or len(batch.num_new_tokens) != len(seqs):
            raise RuntimeError(f"the runner sampled {len(sampled)} tokens for {len(seqs)} sequences")
        bm = self.block_manager
        cache_full_blocks = bm.cache_full_blocks
        bs = bm.block_size
        token = self._token
        eos, tok, one_text, two_text = self.eos_token_ids, self.tokenizer, self.one_text, self.two_text
        outputs = []
        for seq, n, new_tok in zip(seqs, batch.num_new_tokens, sampled):  # noqa: B905 - lengths checked above
            tm = seq.timings
            num_tokens = len(seq.token_ids)
            computed = seq.num_computed_tokens
            # prefilling (more than the one new token to compute) or no output yet: a prefill step
            if num_tokens - computed > 1 or num_tokens == len(seq.prompt_token_ids):
                tm.prefill_ms += step_ms
            else:
                tm.decode_ms += step_ms
            seq.num_computed_tokens = computed = computed + n
            # a block became full (to hash) or computed (to register): most decode steps neither
            if len(seq.block_hashes) < num_tokens // bs or computed // bs > seq.num_cached_blocks:
                cache_full_blocks(seq)
            if new_tok is None:     # a prompt chunk that samples nothing yet
                continue
            try:
                params = seq.params
                if seq.output_filter is not None or params.stop or new_tok in eos:
                    if (out := token(seq, new_tok)) is not None:
                        outputs.append(out)
                    continue
                # _token without a filter, stop strings or EOS (most tokens): the same steps inline
                ids = seq.token_ids
                ids.append(new_tok)
                now = perf_counter()
                if tm.first_token_s is None:
                    tm.first_token_s = now
                tm.token_times_s.append(now)
                detokenize_step(tok, seq, one_text, two_text)
                tm.detok_ms += (perf_counter() - now) * 1e3
                if len(ids) - len(seq.prompt_token_ids) >= params.max_tokens:
                    text = seq.output_text[seq.emitted_chars:]
                    seq.emitted_chars = len(seq.output_text)
                    seq.stop_sequence = seq.error = None
                    self.finish(seq, "length")
                    outputs.append(RequestOutput(seq.request_id, ids[len(seq.prompt_token_ids):] if seq.whole_answer
                                                 else [new_tok], text, True, "length"))
                elif not seq.whole_answer:
                    text = seq.output_text[seq.emitted_chars:]
                    seq.emitted_chars = len(seq.output_text)
                    outputs.append(RequestOutput(seq.request_id, [new_tok], text))
                # else: a whole answer's text waits in output_text for its last delta
            except Exception as exc:  # noqa: BLE001 - this request's detok/filter/stop failed: it alone
                if is_engine_wide(exc):
                    raise
                log.error("request %s failed after sampling", seq.request_id, exc_info=exc)
                outputs += self.fail([seq])
        return outputs

    def _token(self, seq: Sequence, new_tok: int) -> RequestOutput | None:
        """A sampled token's meaning for its request (__call__ runs the same steps inline for a
        token with no output filter, no stop strings and not an EOS id); None: no delta yet (a
        whole answer's, before its last)."""
        perf = perf_counter
        tm = seq.timings
        ids = seq.token_ids
        ids.append(new_tok)
        now = perf()
        if tm.first_token_s is None:
            tm.first_token_s = now
        tm.token_times_s.append(now)
        params = seq.params
        reason: str | None = None
        stop_str: str | None = None
        error: str | None = None
        if new_tok in self.eos_token_ids and not params.ignore_eos:
            reason = "stop"
            ids.pop()  # EOS is not part of the output
        delta_len = len(detokenize_step(self.tokenizer, seq, self.one_text, self.two_text)) if reason is None else 0
        td = perf()
        tm.detok_ms += (td - now) * 1e3
        # the safety filter sees every character before a stop string can cut it
        if seq.output_filter is not None and delta_len:
            verdict = seq.output_filter(seq.output_text)
            tm.safety_ms += (perf() - td) * 1e3
            if verdict is not None:
                reason, error = "content_filter", verdict
                seq.emitted_chars = len(seq.output_text)  # the offending text is never delivered
        if reason is None and params.stop and (stop_str := find_stop(seq, delta_len)) is not None:
            reason = "stop"
            # what the filter still held back could start denied text that the stop cut
            # short: it is never released ("zgto" of a denied "zgtool null" with stop "ol n")
            safe = getattr(seq.output_filter, "safe_chars", None)
            if safe is not None and safe < len(seq.output_text):
                seq.output_text = seq.output_text[:safe]
        if reason is None and len(ids) - len(seq.prompt_token_ids) >= params.max_tokens:
            reason = "length"
        if reason is None and seq.whole_answer:
            return None     # an EOS id it ignores: its text waits in output_text for the last delta
        if reason == "content_filter":
            text = ""
        elif params.stop:
            cleared = None if reason not in (None, "stop") else getattr(seq.output_filter, "safe_chars", None)
            text = emittable(seq, reason is not None, cleared)
        else:   # emittable() without stop strings: everything not yet handed out
            text = seq.output_text[seq.emitted_chars:]
            seq.emitted_chars = len(seq.output_text)
        if reason is not None:
            seq.stop_sequence = stop_str
            seq.error = error
            self.finish(seq, reason)
        if seq.whole_answer:
            new_ids = ids[len(seq.prompt_token_ids):]     # every output token (an EOS is not one)
        else:
            new_ids = [new_tok] if reason != "stop" or stop_str else []
        return RequestOutput(seq.request_id, new_ids, text, reason is not None, reason, stop_str, error)

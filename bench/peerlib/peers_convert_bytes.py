"""convert_hf_to_gguf.py for a byte-level tokenizer it does not know (the dummy models').

Run by the llama venv's Python: `python bench/peerlib/peers_convert_bytes.py LLAMA_CPP_SRC HF_DIR --outfile F
--outtype f32`. The dummy tokenizer is a WordLevel vocabulary over GPT-2's byte alphabet (id = byte),
no merges: the converter refuses its unknown pre-tokenizer hash, and llama.cpp refuses a BPE
vocabulary without merges. So this names the pre-tokenizer gpt-2 and writes one merge of two
special tokens that text never produces; llama.cpp then splits text into byte tokens, the same
ids as the HF tokenizer (checked: b"hello there" -> 104 101 108 108 111 32 ...).
"""

from __future__ import annotations

import runpy
import sys
from typing import Any


def main() -> None:
    src = sys.argv.pop(1)
    sys.path[:0] = [src, src + "/gguf-py"]
    import conversion.base as base  # the sdist's converter package, on the path just set

    def pre(self: Any, tokenizer: Any) -> str:
        return "gpt-2"

    plain_gpt2 = base.TextModel._set_vocab_gpt2

    def gpt2_with_one_merge(self: Any) -> None:
        plain_gpt2(self)
        vocab = self.hparams.get("vocab_size") or 0
        if vocab >= 2:
            self.gguf_writer.add_token_merges([f"<w{vocab - 2}> <w{vocab - 1}>"])

    base.TextModel.get_vocab_base_pre = pre
    base.TextModel._set_vocab_gpt2 = gpt2_with_one_merge
    sys.argv[0] = src + "/convert_hf_to_gguf.py"
    runpy.run_path(sys.argv[0], run_name="__main__")


if __name__ == "__main__":
    main()

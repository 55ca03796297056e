"""The answer's Content-Encoding undone as its bytes arrive: the OpenAI and Anthropic SDKs (httpx) accept
"gzip, deflate", and a compressing hop (nginx's gzip filter) answers them compressed, holding a stream's chunks
back until its buffer fills. The measuring client accepts what they accept (--accept-encoding) and decodes
each read as it comes, so every event is stamped with the arrival of the compressed bytes that completed it.

Bounded like the OTLP receiver's inflate: a few KB that inflate to gigabytes stop at MAX_DECODED_BYTES."""

from __future__ import annotations

import zlib
from collections.abc import Iterable, Iterator

from zgtool.latency.attribution.inflate import GZIP_WBITS

MAX_DECODED_BYTES = 256 * 1024 * 1024
AUTO_WBITS = 47          # zlib's automatic header detection: a gzip member or a zlib stream
RAW_WBITS = -15          # "deflate" sent as a bare DEFLATE stream (some servers do, RFC 9110 notwithstanding)


class DecodeError(ValueError):
    """The answer's body does not decode by its Content-Encoding (or decodes past the bound)."""


def coding_of(value: str | None) -> str | None:
    """The Content-Encoding to undo, lower case; None for none or identity."""
    v = (value or "").strip().lower()
    return None if v in ("", "identity") else v


def decoded(chunks: Iterable[bytes], coding: str) -> Iterator[bytes]:
    """Each compressed chunk's decoded bytes (b"" while the compressor held them), in arrival order."""
    if coding in ("gzip", "x-gzip"):
        wbits = GZIP_WBITS
    elif coding == "deflate":
        wbits = AUTO_WBITS
    else:
        raise DecodeError(f"content-encoding {coding!r}, which zgtool's client did not ask for and does not decode")
    d = zlib.decompressobj(wbits=wbits)
    total, first = 0, True
    for chunk in chunks:
        try:
            out = d.decompress(chunk, MAX_DECODED_BYTES + 1 - total)
        except zlib.error as exc:
            if not (first and coding == "deflate"):
                raise DecodeError(f"the {coding} body does not decode: {exc}") from None
            d = zlib.decompressobj(wbits=RAW_WBITS)        # a bare DEFLATE stream
            try:
                out = d.decompress(chunk, MAX_DECODED_BYTES + 1 - total)
            except zlib.error as exc2:
                raise DecodeError(f"the {coding} body does not decode: {exc2}") from None
        first = first and not chunk
        total += len(out)
        if total > MAX_DECODED_BYTES or d.unconsumed_tail:
            raise DecodeError(f"the {coding} body decodes past {MAX_DECODED_BYTES} bytes")
        yield out
    if not d.eof:
        raise DecodeError(f"the {coding} body ends before its compressed stream does")

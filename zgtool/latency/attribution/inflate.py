"""Decompression with a bound: an OTLP body (gzip over HTTP, gzip or deflate in a gRPC message) is inflated to at
most `max_bytes`, so a few KB that inflate to gigabytes (a body of zeros compresses ~1000:1) cost the receiver
no more memory than the largest body it accepts."""

from __future__ import annotations

import zlib

GZIP_WBITS = 31      # zlib's window bits for a gzip member (RFC 1952)
ZLIB_WBITS = 15      # a zlib stream (RFC 1950): gRPC's "deflate"


class InflateError(ValueError):
    """The data does not inflate, or inflates past the bound (`too_large`)."""

    def __init__(self, message: str, *, too_large: bool = False) -> None:
        super().__init__(message)
        self.too_large = too_large


def inflate(data: bytes, *, wbits: int, max_bytes: int) -> bytes:
    d = zlib.decompressobj(wbits=wbits)
    try:
        out = d.decompress(data, max_bytes + 1)
    except zlib.error as exc:
        raise InflateError(f"does not decompress: {exc}") from None
    if len(out) > max_bytes:
        raise InflateError(f"over {max_bytes} bytes decompressed", too_large=True)
    if not d.eof:
        raise InflateError("does not decompress: the compressed data ends early")
    return out

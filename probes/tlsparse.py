"""Parse the plaintext start of a TLS handshake (ClientHello / ServerHello) and compute JA4S.

Works on raw bytes from a live handshake (probe tls) or from a capture (probe tcp --read).
JA4S (FoxIO-LLC/ja4 technical_details/JA4S.md):
    t + version + ext count + ALPN first/last char _ chosen cipher _ sha256(ext types in wire order)[:12]
In TLS 1.3 the chosen ALPN travels encrypted (EncryptedExtensions), so JA4S shows "00" there,
as it does in any passive capture.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

VERSIONS = {0x0304: "TLSv1.3", 0x0303: "TLSv1.2", 0x0302: "TLSv1.1", 0x0301: "TLSv1.0", 0x0300: "SSLv3"}
JA4_VERSION = {0x0304: "13", 0x0303: "12", 0x0302: "11", 0x0301: "10", 0x0300: "s3"}
CIPHERS = {
    0x1301: "TLS_AES_128_GCM_SHA256", 0x1302: "TLS_AES_256_GCM_SHA384", 0x1303: "TLS_CHACHA20_POLY1305_SHA256",
    0xC02B: "ECDHE-ECDSA-AES128-GCM-SHA256", 0xC02C: "ECDHE-ECDSA-AES256-GCM-SHA384",
    0xC02F: "ECDHE-RSA-AES128-GCM-SHA256", 0xC030: "ECDHE-RSA-AES256-GCM-SHA384",
    0xCCA8: "ECDHE-RSA-CHACHA20-POLY1305", 0xCCA9: "ECDHE-ECDSA-CHACHA20-POLY1305",
    0x009C: "AES128-GCM-SHA256", 0x009D: "AES256-GCM-SHA384", 0x002F: "AES128-SHA", 0x0035: "AES256-SHA",
}
EXT_SNI, EXT_ALPN, EXT_SUPPORTED_VERSIONS = 0, 16, 43
HRR_RANDOM = bytes.fromhex("cf21ad74e59a6111be1d8c021e65b891c2a211167abb8c5e079e09e2c8a8339c")


class TLSParseError(ValueError):
    pass


@dataclass
class ServerHello:
    version: str                      # negotiated (supported_versions wins over legacy_version)
    version_code: int
    cipher: str
    cipher_code: int
    extensions: list[int] = field(default_factory=list)   # wire order
    alpn: str | None = None           # only when carried in the ServerHello (TLS <= 1.2)
    hello_retry: bool = False

    @property
    def ja4s(self) -> str:
        return ja4s(self)


@dataclass
class ClientHello:
    sni: str | None
    alpn_offered: list[str]
    num_ciphers: int
    extensions: list[int]


def iter_handshake_messages(stream: bytes) -> list[tuple[int, bytes]]:
    """Handshake messages (type, body) from the plaintext TLS records at the start of `stream`.

    Stops at the first non-handshake record (ChangeCipherSpec, encrypted data) or a truncated one.
    """
    msgs: list[tuple[int, bytes]] = []
    hs = b""
    i = 0
    while i + 5 <= len(stream):
        ctype, length = stream[i], int.from_bytes(stream[i + 3:i + 5], "big")
        if ctype != 22:
            break
        frag = stream[i + 5:i + 5 + length]
        i += 5 + length
        hs += frag
        while len(hs) >= 4:
            mlen = int.from_bytes(hs[1:4], "big")
            if len(hs) < 4 + mlen:
                break
            msgs.append((hs[0], hs[4:4 + mlen]))
            hs = hs[4 + mlen:]
        if len(frag) < length:
            break
    return msgs


def is_tls_record(data: bytes) -> bool:
    return len(data) >= 3 and data[0] == 22 and data[1] == 3


def _extensions(body: bytes, at: int) -> list[tuple[int, bytes]]:
    if at + 2 > len(body):
        return []
    end = at + 2 + int.from_bytes(body[at:at + 2], "big")
    at += 2
    out = []
    while at + 4 <= min(end, len(body)):
        etype, elen = int.from_bytes(body[at:at + 2], "big"), int.from_bytes(body[at + 2:at + 4], "big")
        out.append((etype, body[at + 4:at + 4 + elen]))
        at += 4 + elen
    return out


def _alpn_list(data: bytes) -> list[str]:
    out, i = [], 2
    while i < len(data):
        n = data[i]
        out.append(data[i + 1:i + 1 + n].decode("ascii", "replace"))
        i += 1 + n
    return out


def parse_server_hello(body: bytes) -> ServerHello:
    if len(body) < 38:
        raise TLSParseError("ServerHello too short")
    legacy = int.from_bytes(body[0:2], "big")
    random = body[2:34]
    sid_len = body[34]
    at = 35 + sid_len
    if at + 3 > len(body):
        raise TLSParseError("ServerHello truncated")
    cipher = int.from_bytes(body[at:at + 2], "big")
    exts = _extensions(body, at + 3)
    version = legacy
    alpn = None
    for etype, data in exts:
        if etype == EXT_SUPPORTED_VERSIONS and len(data) >= 2:
            version = int.from_bytes(data[:2], "big")
        elif etype == EXT_ALPN:
            names = _alpn_list(data)
            alpn = names[0] if names else None
    return ServerHello(VERSIONS.get(version, f"0x{version:04x}"), version,
                       CIPHERS.get(cipher, f"0x{cipher:04x}"), cipher, [e for e, _ in exts], alpn,
                       hello_retry=random == HRR_RANDOM)


def parse_client_hello(body: bytes) -> ClientHello:
    if len(body) < 38:
        raise TLSParseError("ClientHello too short")
    at = 35 + body[34]
    nciph = int.from_bytes(body[at:at + 2], "big")
    at += 2 + nciph
    at += 1 + body[at]
    exts = _extensions(body, at)
    sni, alpn = None, []
    for etype, data in exts:
        if etype == EXT_SNI and len(data) > 5:
            n = int.from_bytes(data[3:5], "big")
            sni = data[5:5 + n].decode("ascii", "replace")
        elif etype == EXT_ALPN:
            alpn = _alpn_list(data)
    return ClientHello(sni, alpn, nciph // 2, [e for e, _ in exts])


def find_server_hello(stream: bytes) -> ServerHello | None:
    for mtype, body in iter_handshake_messages(stream):
        if mtype == 2:
            return parse_server_hello(body)
    return None


def find_client_hello(stream: bytes) -> ClientHello | None:
    for mtype, body in iter_handshake_messages(stream):
        if mtype == 1:
            return parse_client_hello(body)
    return None


def ja4s(sh: ServerHello) -> str:
    ver = JA4_VERSION.get(sh.version_code, "00")
    alpn = f"{sh.alpn[0]}{sh.alpn[-1]}" if sh.alpn else "00"
    ext_hash = (hashlib.sha256(",".join(f"{e:04x}" for e in sh.extensions).encode()).hexdigest()[:12]
                if sh.extensions else "000000000000")
    return f"t{ver}{min(len(sh.extensions), 99):02d}{alpn}_{sh.cipher_code:04x}_{ext_hash}"

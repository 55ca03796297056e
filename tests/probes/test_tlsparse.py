"""ServerHello / ClientHello parsing and JA4S against the JA4S specification's own examples."""

from __future__ import annotations

import pytest

from zgtool.probes.tlsparse import find_client_hello, find_server_hello, iter_handshake_messages


def ext(etype: int, data: bytes = b"") -> bytes:
    return etype.to_bytes(2, "big") + len(data).to_bytes(2, "big") + data


def server_hello(legacy: int, cipher: int, exts: list[bytes]) -> bytes:
    body = legacy.to_bytes(2, "big") + bytes(32) + b"\x20" + bytes(32) + cipher.to_bytes(2, "big") + b"\x00"
    blob = b"".join(exts)
    body += len(blob).to_bytes(2, "big") + blob
    msg = b"\x02" + len(body).to_bytes(3, "big") + body
    return b"\x16\x03\x03" + len(msg).to_bytes(2, "big") + msg


def test_ja4s_of_a_tls13_server_hello_matches_the_spec_example() -> None:
    raw = server_hello(0x0303, 0x1301, [ext(0x0033, bytes(36)), ext(0x002B, b"\x03\x04")])
    sh = find_server_hello(raw + b"\x14\x03\x03\x00\x01\x01")  # followed by ChangeCipherSpec
    assert sh is not None
    assert (sh.version, sh.cipher, sh.extensions) == ("TLSv1.3", "TLS_AES_128_GCM_SHA256", [0x33, 0x2B])
    assert sh.ja4s == "t130200_1301_234ea6891581"


def test_ja4s_of_a_tls12_server_hello_with_alpn_matches_the_spec_example() -> None:
    alpn = ext(0x0010, b"\x00\x03\x02h2")
    raw = server_hello(0x0303, 0xC030, [ext(0x0005), ext(0x0017), ext(0xFF01, b"\x00"), ext(0x0000)])
    assert find_server_hello(raw).ja4s == "t120400_c030_4e8089b08790"
    with_alpn = find_server_hello(server_hello(0x0303, 0xC02F, [alpn]))
    assert with_alpn.alpn == "h2" and with_alpn.ja4s.startswith("t1201h2_c02f_")


def test_a_handshake_split_across_records_is_reassembled() -> None:
    raw = server_hello(0x0303, 0x1302, [ext(0x002B, b"\x03\x04")])
    msg = raw[5:]
    split = b"\x16\x03\x03" + (10).to_bytes(2, "big") + msg[:10] + b"\x16\x03\x03" + \
        (len(msg) - 10).to_bytes(2, "big") + msg[10:]
    assert find_server_hello(split).cipher == "TLS_AES_256_GCM_SHA384"


def test_client_hello_yields_sni_and_offered_alpn() -> None:
    sni = b"api.example.com"
    sni_ext = ext(0x0000, (len(sni) + 3).to_bytes(2, "big") + b"\x00" + len(sni).to_bytes(2, "big") + sni)
    alpn = ext(0x0010, b"\x00\x0c\x02h2\x08http/1.1")
    exts = sni_ext + alpn
    body = (b"\x03\x03" + bytes(32) + b"\x00" + b"\x00\x04\x13\x01\x13\x02" + b"\x01\x00"
            + len(exts).to_bytes(2, "big") + exts)
    msg = b"\x01" + len(body).to_bytes(3, "big") + body
    ch = find_client_hello(b"\x16\x03\x01" + len(msg).to_bytes(2, "big") + msg)
    assert (ch.sni, ch.alpn_offered, ch.num_ciphers) == ("api.example.com", ["h2", "http/1.1"], 2)


@pytest.mark.parametrize("junk", [b"", b"GET / HTTP/1.1\r\n", b"\x16\x03\x03\x00\x10\x02\x00"])
def test_non_tls_or_truncated_bytes_yield_no_hello(junk: bytes) -> None:
    assert find_server_hello(junk) is None
    assert iter_handshake_messages(junk) == []

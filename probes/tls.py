"""`probe tls`: what terminates TLS in front of the model, and what its handshake reveals.

The handshake runs over memory BIOs so the ServerHello bytes are seen exactly as sent
(for the JA4S string); the certificate is read without trusting it, and a second,
verifying handshake says whether a client with the system CAs would accept it.

Result data (kind "probe.tls"):
    url, host, port, sni, connect_ms, handshake_ms, version, cipher, cipher_bits,
    alpn_offered [str], alpn (chosen) | None,
    server_hello {version, version_code, cipher, cipher_code, extensions [int], alpn, hello_retry} | None,
    ja4s str | None,
    certificate {subject_cn, subject, sans_dns [str], sans_ip [str], issuer, issuer_cn, not_before,
                 not_after, days_left, self_signed, serial, key_type, key_bits, signature_algorithm, sha256},
    chain_length int | None, verified bool, verify_error str | None, notes [str]
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import socket
import ssl
import time
from dataclasses import dataclass, field

from zgtool.errors import TargetUnreachable, UsageError
from zgtool.probes.tlsparse import ServerHello, find_server_hello
from zgtool.targets import Target

ALPN_OFFER = ("h2", "http/1.1")
ISSUER_HINTS = {
    "cloudflare": "certificate issued by Cloudflare: Cloudflare's edge terminates TLS",
    "amazon": "AWS-managed certificate (ACM): an ALB, CloudFront or API Gateway terminates TLS",
    "google trust services": "Google-managed certificate: typical of Google front ends / Cloud Load Balancing",
    "microsoft azure": "Azure-managed certificate: Front Door, Application Gateway or APIM terminates TLS",
}


@dataclass
class Certificate:
    subject_cn: str | None
    subject: str
    sans_dns: list[str]
    sans_ip: list[str]
    issuer: str
    issuer_cn: str | None
    not_before: str
    not_after: str
    days_left: float
    self_signed: bool
    serial: str
    key_type: str
    key_bits: int | None
    signature_algorithm: str | None
    sha256: str


@dataclass
class TlsResult:
    url: str
    host: str
    port: int
    sni: str | None
    connect_ms: float
    handshake_ms: float
    version: str | None
    cipher: str | None
    cipher_bits: int | None
    alpn_offered: list[str]
    alpn: str | None
    server_hello: ServerHello | None
    ja4s: str | None
    certificate: Certificate | None
    chain_length: int | None
    verified: bool
    verify_error: str | None
    notes: list[str] = field(default_factory=list)


def parse_certificate(der: bytes) -> Certificate:
    from cryptography import x509
    from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa
    from cryptography.x509.oid import NameOID

    cert = x509.load_der_x509_certificate(der)

    def cn(name: x509.Name) -> str | None:
        attrs = name.get_attributes_for_oid(NameOID.COMMON_NAME)
        return str(attrs[0].value) if attrs else None

    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        dns, ips = san.get_values_for_type(x509.DNSName), [str(i) for i in san.get_values_for_type(x509.IPAddress)]
    except x509.ExtensionNotFound:
        dns, ips = [], []
    key = cert.public_key()
    key_type = {rsa.RSAPublicKey: "RSA", ec.EllipticCurvePublicKey: "EC",
                ed25519.Ed25519PublicKey: "Ed25519"}
    ktype = next((name for cls, name in key_type.items() if isinstance(key, cls)), type(key).__name__)
    bits = getattr(key, "key_size", None)
    not_after = cert.not_valid_after_utc
    sig = cert.signature_hash_algorithm
    return Certificate(
        subject_cn=cn(cert.subject), subject=cert.subject.rfc4514_string(), sans_dns=list(dns), sans_ip=ips,
        issuer=cert.issuer.rfc4514_string(), issuer_cn=cn(cert.issuer),
        not_before=cert.not_valid_before_utc.isoformat(), not_after=not_after.isoformat(),
        days_left=round((not_after - _dt.datetime.now(_dt.UTC)).total_seconds() / 86400, 2),
        self_signed=cert.issuer == cert.subject, serial=f"{cert.serial_number:x}", key_type=ktype,
        key_bits=bits, signature_algorithm=f"{ktype}-{sig.name}" if sig else None,
        sha256=hashlib.sha256(der).hexdigest())


def _connect(host: str, port: int, timeout_s: float) -> tuple[socket.socket, float]:
    t0 = time.perf_counter()
    try:
        s = socket.create_connection((host, port), timeout=timeout_s)
    except socket.gaierror as exc:
        raise TargetUnreachable(f"cannot resolve {host!r}: {exc.strerror or exc}") from exc
    except ConnectionRefusedError as exc:
        raise TargetUnreachable(f"connection refused by {host}:{port}") from exc
    except TimeoutError as exc:
        raise TargetUnreachable(f"timed out connecting to {host}:{port} after {timeout_s:g} s") from exc
    except OSError as exc:
        raise TargetUnreachable(f"cannot connect to {host}:{port}: {exc.strerror or exc}") from exc
    return s, (time.perf_counter() - t0) * 1e3


def _handshake(sock: socket.socket, ctx: ssl.SSLContext, sni: str | None) -> tuple[ssl.SSLObject, bytes]:
    """Drive the handshake by hand; returns the SSLObject and every byte the server sent."""
    inc, out = ssl.MemoryBIO(), ssl.MemoryBIO()
    obj = ctx.wrap_bio(inc, out, server_hostname=sni)
    received = bytearray()
    while True:
        try:
            obj.do_handshake()
            break
        except ssl.SSLWantReadError:
            pending = out.read()
            if pending:
                sock.sendall(pending)
            chunk = sock.recv(65536)
            if not chunk:
                raise ConnectionResetError("server closed the connection during the TLS handshake") from None
            received += chunk
            inc.write(chunk)
    pending = out.read()
    if pending:
        sock.sendall(pending)
    return obj, bytes(received)


def _is_ip(host: str) -> bool:
    try:
        socket.inet_pton(socket.AF_INET6 if ":" in host else socket.AF_INET, host)
        return True
    except OSError:
        return False


def probe_tls(target: Target, *, timeout_s: float = 10.0, sni: str | None = None) -> TlsResult:
    if target.scheme != "https":
        raise UsageError(f"{target.url} is plain http; probe tls needs an https:// target")
    host, port = target.host, target.port
    sni = sni or (None if _is_ip(host) else host)
    ctx = ssl._create_unverified_context()
    ctx.set_alpn_protocols(list(ALPN_OFFER))
    sock, connect_ms = _connect(host, port, timeout_s)
    try:
        t0 = time.perf_counter()
        try:
            obj, received = _handshake(sock, ctx, sni)
        except (ssl.SSLError, OSError) as exc:
            raise TargetUnreachable(f"{host}:{port} does not complete a TLS handshake: {exc}") from exc
        handshake_ms = (time.perf_counter() - t0) * 1e3
        der = obj.getpeercert(binary_form=True)
        chain = getattr(getattr(obj, "_sslobj", None), "get_unverified_chain", None)
        chain_len = len(chain() or []) if chain else None
        cipher = obj.cipher()
        version, alpn = obj.version(), obj.selected_alpn_protocol()
    finally:
        sock.close()
    try:
        sh = find_server_hello(received)
    except ValueError:
        sh = None
    cert = parse_certificate(der) if der else None
    verified, verify_error = _verify(host, port, sni, timeout_s)
    result = TlsResult(
        url=target.url, host=host, port=port, sni=sni, connect_ms=round(connect_ms, 3),
        handshake_ms=round(handshake_ms, 3), version=version, cipher=cipher[0] if cipher else None,
        cipher_bits=cipher[2] if cipher else None, alpn_offered=list(ALPN_OFFER), alpn=alpn,
        server_hello=sh, ja4s=sh.ja4s if sh else None, certificate=cert, chain_length=chain_len,
        verified=verified, verify_error=verify_error)
    result.notes = terminator_notes(result)
    return result


def _verify(host: str, port: int, sni: str | None, timeout_s: float) -> tuple[bool, str | None]:
    """Would a default client (system CAs, hostname check) accept this endpoint?"""
    ctx = ssl.create_default_context()
    if sni is None:
        ctx.check_hostname = False
    sock, _ = _connect(host, port, timeout_s)
    try:
        _handshake(sock, ctx, sni)
        return True, None
    except ssl.SSLCertVerificationError as exc:
        return False, exc.verify_message or str(exc)
    except (ssl.SSLError, OSError) as exc:
        return False, str(exc)
    finally:
        sock.close()


def terminator_notes(r: TlsResult) -> list[str]:
    """What the handshake says about whoever terminates TLS."""
    notes = []
    if r.alpn == "h2":
        notes.append("the terminator chose h2 from our offer (h2, http/1.1): uvicorn-based origins (zgtool serve, "
                     "vLLM, SGLang) speak only HTTP/1.1, so a proxy, load balancer or CDN terminates TLS here")
    elif r.alpn == "http/1.1":
        notes.append("h2 was offered but only HTTP/1.1 was chosen: consistent with a Python/uvicorn origin "
                     "terminating TLS itself, or a proxy configured for HTTP/1.1 only")
    else:
        notes.append("no ALPN negotiated: the terminator ignores ALPN (rare for CDNs and modern proxies)")
    c = r.certificate
    if c is not None:
        if c.self_signed:
            notes.append("self-signed certificate: a development or internal endpoint, not a public CDN edge")
        issuer = c.issuer.lower()
        notes += [hint for key, hint in ISSUER_HINTS.items() if key in issuer]
        if c.days_left < 0:
            notes.append(f"the certificate expired {-c.days_left:.0f} days ago")
        elif c.days_left < 14:
            notes.append(f"the certificate expires in {c.days_left:.1f} days")
    if r.ja4s:
        notes.append(f"JA4S {r.ja4s} fingerprints the TLS stack that answered (for our fixed ClientHello); "
                     "servers on the same library (e.g. Python ssl and nginx, both OpenSSL) can share it")
    return notes

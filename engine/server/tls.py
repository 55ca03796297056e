"""In-process TLS: a self-signed certificate for localhost (generated with ``cryptography``)."""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
from dataclasses import dataclass
from pathlib import Path

from zgtool.errors import UsageError


@dataclass(frozen=True)
class TlsFiles:
    cert_path: Path
    key_path: Path
    sha256_fingerprint: str          # colon-separated hex, as browsers and openssl show it


def fingerprint(cert_pem: bytes) -> str:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes

    cert = x509.load_pem_x509_certificate(cert_pem)
    return ":".join(f"{b:02X}" for b in cert.fingerprint(hashes.SHA256()))


def self_signed(out_dir: Path, days: int = 30) -> TlsFiles:
    """Write cert.pem/key.pem (EC P-256, SAN localhost + 127.0.0.1 + ::1) into out_dir."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "zgtool-engine localhost")])
    now = dt.datetime.now(dt.UTC)
    san = x509.SubjectAlternativeName([
        x509.DNSName("localhost"),
        x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
        x509.IPAddress(ipaddress.ip_address("::1")),
    ])
    cert = (
        x509.CertificateBuilder()
        .subject_name(name).issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=days))
        .add_extension(san, critical=False)
        # CA:TRUE so clients can trust this very file as their CA bundle (verify=cert.pem).
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        # Key usage and key identifiers keep strict verifiers (VERIFY_X509_STRICT) happy.
        .add_extension(x509.KeyUsage(
            digital_signature=True, key_cert_sign=True, content_commitment=False, key_encipherment=False,
            data_encipherment=False, key_agreement=False, crl_sign=False, encipher_only=False,
            decipher_only=False), critical=True)
        .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    cert_pem = cert.public_bytes(serialization.Encoding.PEM)
    cert_path = out_dir / "cert.pem"
    key_path = out_dir / "key.pem"
    cert_path.write_bytes(cert_pem)
    fd = os.open(key_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                   serialization.NoEncryption()))
    return TlsFiles(cert_path, key_path, fingerprint(cert_pem))


def given(cert: Path, key: Path) -> TlsFiles:
    """User-supplied files: checked up front so a typo is a one-line error, not a uvicorn trace."""
    for p, what in ((cert, "--tls-cert"), (key, "--tls-key")):
        if not Path(p).is_file():
            raise UsageError(f"{what} {p} does not exist")
    try:
        fp = fingerprint(Path(cert).read_bytes())
    except ValueError as exc:
        raise UsageError(f"--tls-cert {cert} is not a PEM certificate: {exc}") from exc
    return TlsFiles(Path(cert), Path(key), fp)

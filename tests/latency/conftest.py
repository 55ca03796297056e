"""Real local servers for latency-split tests, started once per session on free ports and stopped."""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

HERE = Path(__file__).parent
FIXTURE = HERE / "fixture_server.py"


class Proc:
    def __init__(self, *args: str) -> None:
        self.proc = subprocess.Popen([sys.executable, str(FIXTURE), *args], stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
        line = self.proc.stdout.readline() if self.proc.stdout else ""
        if not line.startswith("PORT "):
            err = self.proc.stderr.read() if self.proc.stderr else ""
            self.stop()
            raise RuntimeError(f"fixture server {args} did not start: {line!r} {err}")
        self.port = int(line.split()[1])

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def _self_signed(tmp: Path) -> tuple[Path, Path]:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = dt.datetime.now(dt.UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + dt.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost"),
                                                        x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                           critical=False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    certfile, keyfile = tmp / "cert.pem", tmp / "key.pem"
    certfile.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    keyfile.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                          serialization.NoEncryption()))
    return certfile, keyfile


@pytest.fixture(scope="session")
def origin_proc() -> Iterator[Proc]:
    p = Proc("origin")
    yield p
    p.stop()


@pytest.fixture(scope="session")
def origin(origin_proc: Proc) -> str:
    return f"http://127.0.0.1:{origin_proc.port}"


@pytest.fixture(scope="session")
def gateway(origin: str) -> Iterator[str]:
    p = Proc("gateway", "--upstream", origin)
    yield f"http://127.0.0.1:{p.port}"
    p.stop()


@pytest.fixture(scope="session")
def tls_origin(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    """(https URL by name, CA file): the name makes DNS and SNI real, the cert is its own CA."""
    certfile, keyfile = _self_signed(tmp_path_factory.mktemp("tls"))
    p = Proc("origin", "--certfile", str(certfile), "--keyfile", str(keyfile))
    yield f"https://localhost:{p.port}", certfile
    p.stop()


@pytest.fixture(scope="session")
def flaky_origin() -> Iterator[str]:
    """Answers every third request with 529 overloaded_error."""
    p = Proc("origin", "--fail-every", "3")
    yield f"http://127.0.0.1:{p.port}"
    p.stop()


@pytest.fixture()
def closed_port_url() -> str:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # nothing listens here now: connects are refused
    return f"http://127.0.0.1:{port}"


@pytest.fixture(scope="session")
def failing_origin() -> Iterator[str]:
    """Answers every request with 529 overloaded_error."""
    p = Proc("origin", "--fail-every", "1")
    yield f"http://127.0.0.1:{p.port}"
    p.stop()

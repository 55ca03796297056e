"""`--cacert FILE` / `--insecure` into one TLS verification setting, and a certificate failure
recognised wherever it surfaces (httpx and the SDKs wrap the ssl error differently)."""

from __future__ import annotations

import ssl
from pathlib import Path

from zgtool.errors import UsageError

CERT_HINT = "use --cacert FILE (e.g. the cert.pem `zgtool serve --tls self-signed` wrote) or --insecure"


def verify_setting(insecure: bool, cacert: Path | None) -> bool | str:
    """True (system CAs), False (--insecure) or the CA bundle's path (--cacert)."""
    if insecure and cacert is not None:
        raise UsageError("--insecure and --cacert exclude each other")
    if cacert is not None:
        if not cacert.is_file():
            raise UsageError(f"--cacert {cacert}: no such file")
        return str(cacert)
    return not insecure


def is_cert_failure(exc: BaseException | None) -> bool:
    """Does this exception (or anything in its cause chain) say the certificate did not verify?"""
    seen = 0
    while exc is not None and seen < 10:
        if isinstance(exc, ssl.SSLCertVerificationError) or "CERTIFICATE_VERIFY_FAILED" in str(exc):
            return True
        exc = exc.__cause__ or exc.__context__
        seen += 1
    return False

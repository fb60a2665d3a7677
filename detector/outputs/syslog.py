"""`syslog+udp|tcp|tls://HOST[:PORT]`: alerts as RFC 5424 messages (rfc5424.py) to a syslog
receiver. UDP sends one message per datagram (RFC 5426); TCP and TLS use octet-counted framing
(RFC 6587 3.4.1, RFC 5425), so a message may hold any byte, newlines included.

Query options: `format=json|cef`, `facility=NAME|NUMBER`, `max_bytes=N` (default 8192, what
rsyslog accepts by default, at least 2048; a larger alert is cut to fit, see fit.py; over
UDP also at most what one datagram carries), for TLS `ca=FILE`, `cert=FILE`, `key=FILE`.
"""

from __future__ import annotations

import errno
import select
import socket
import ssl
from dataclasses import dataclass
from urllib.parse import parse_qs, urlsplit

from hpcsec.detector.outputs.protocol import (
    Alert,
    DeliveryFailed,
    OutputError,
    OutputOptions,
    redact,
)
from hpcsec.detector.outputs.rfc5424 import (
    DEFAULT_MAX_BYTES,
    FACILITIES,
    MIN_MAX_BYTES,
    format_message,
)

DEFAULT_PORTS = {"udp": 514, "tcp": 514, "tls": 6514}
QUERY_KEYS = ("format", "facility", "max_bytes", "ca", "cert", "key")


def octet_frame(message: bytes) -> bytes:
    """RFC 6587 3.4.1 octet counting: `MSG-LEN SP MSG`, the length in bytes of the message."""
    return str(len(message)).encode() + b" " + message


class _Stream:
    """A TCP or TLS connection, made on first use and again after it breaks."""

    def __init__(self, host: str, port: int, timeout_s: float, tls: ssl.SSLContext | None = None):
        self.host, self.port, self.timeout_s, self.tls = host, port, timeout_s, tls
        self.sock: socket.socket | None = None

    def _peer_closed(self) -> bool:
        assert self.sock is not None
        readable, _, _ = select.select([self.sock], [], [], 0)
        if not readable:
            return False
        if isinstance(self.sock, ssl.SSLSocket):
            # TLS 1.3 servers send session tickets after the handshake: readable is not EOF.
            # A syslog receiver sends no data, so reading what is there loses nothing.
            self.sock.setblocking(False)
            try:
                return self.sock.recv(4096) == b""
            except ssl.SSLWantReadError:
                return False
            except (ssl.SSLError, OSError):
                return True
            finally:
                self.sock.settimeout(self.timeout_s)
        try:
            return self.sock.recv(1, socket.MSG_PEEK) == b""
        except (ssl.SSLError, OSError):
            return True

    def _connect(self) -> socket.socket:
        sock = socket.create_connection((self.host, self.port), timeout=self.timeout_s)
        if self.tls is None:
            return sock
        try:
            return self.tls.wrap_socket(sock, server_hostname=self.host)
        except BaseException:
            sock.close()
            raise

    def send(self, data: bytes) -> None:
        try:
            if self.sock is not None and self._peer_closed():
                self.close()  # a receiver restart: reconnect rather than write into the void
            if self.sock is None:
                self.sock = self._connect()
            self.sock.sendall(data)
        except (OSError, ssl.SSLError) as exc:
            self.close()
            raise DeliveryFailed(f"{self.host}:{self.port}: {exc}") from None

    def close(self) -> None:
        if self.sock is not None:
            try:
                self.sock.close()
            finally:
                self.sock = None


# The largest UDP payload: 65,535 less the UDP header (8) and, on IPv4, the IP header (20);
# Linux counts the 40-byte IPv6 header against IPv6's 65,535 too.
DATAGRAM_LIMIT = {socket.AF_INET: 65_507, socket.AF_INET6: 65_487}


class _Datagram:
    def __init__(self, host: str, port: int):
        self.host, self.port = host, port
        self.sock: socket.socket | None = None

    def _open(self) -> socket.socket:
        if self.sock is None:
            try:
                info = socket.getaddrinfo(self.host, self.port, type=socket.SOCK_DGRAM)[0]
                sock = socket.socket(info[0], socket.SOCK_DGRAM)
                sock.connect(info[4])  # connected: a port-unreachable shows up as an error
            except OSError as exc:
                raise DeliveryFailed(f"{self.host}:{self.port}: {exc}") from None
            self.sock = sock
        return self.sock

    def limit(self) -> int:
        """The largest message one datagram to this receiver can carry."""
        return DATAGRAM_LIMIT.get(self._open().family, DATAGRAM_LIMIT[socket.AF_INET6])

    def send(self, data: bytes) -> None:
        sock = self._open()
        try:
            sock.send(data)
        except OSError as exc:
            self.close()
            # messages are cut to limit(): a refusal for size is the path MTU of a
            # receiver that does not fragment; no retry can help this message
            raise DeliveryFailed(
                f"{self.host}:{self.port}: {exc}", permanent=exc.errno == errno.EMSGSIZE
            ) from None

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = None


def _tls_context(query: dict[str, str], url: str) -> ssl.SSLContext:
    try:
        context = ssl.create_default_context(cafile=query.get("ca"))
        if query.get("cert"):
            context.load_cert_chain(query["cert"], query.get("key"))
    except (OSError, ssl.SSLError) as exc:
        raise OutputError(f"output {redact(url)}: TLS files: {exc}") from None
    return context


@dataclass(frozen=True)
class _MessageSettings:
    facility: int
    body_format: str
    max_bytes: int


def _query(url: str, query_text: str) -> dict[str, str]:
    raw = parse_qs(query_text, keep_blank_values=True)
    unknown = sorted(set(raw) - set(QUERY_KEYS))
    if unknown:
        raise OutputError(
            f"output {redact(url)}: unknown option(s) {', '.join(unknown)} "
            f"(expected: {', '.join(QUERY_KEYS)})"
        )
    return {k: v[-1] for k, v in raw.items()}


def _message_settings(url: str, query: dict[str, str], default_format: str) -> _MessageSettings:
    body_format = query.get("format", default_format)
    if body_format not in ("json", "cef"):
        raise OutputError(f"output {redact(url)}: format must be json or cef")
    facility_name = query.get("facility", "authpriv")
    facility = (
        int(facility_name) if facility_name.isdigit() else FACILITIES.get(facility_name.lower(), -1)
    )
    if not 0 <= facility <= 23:
        raise OutputError(f"output {redact(url)}: unknown facility {facility_name!r}")
    try:
        max_bytes = int(query.get("max_bytes", str(DEFAULT_MAX_BYTES)))
    except ValueError:
        raise OutputError(f"output {redact(url)}: max_bytes must be a number") from None
    if max_bytes < MIN_MAX_BYTES:
        raise OutputError(f"output {redact(url)}: max_bytes must be at least {MIN_MAX_BYTES}")
    return _MessageSettings(facility, body_format, max_bytes)


class SyslogOutput:
    durable = True

    def __init__(
        self,
        name: str,
        transport: _Stream | _Datagram,
        *,
        facility: int,
        body_format: str,
        max_bytes: int,
        framed: bool,
    ):
        self.name, self.transport = name, transport
        self.facility, self.body_format, self.max_bytes = facility, body_format, max_bytes
        self.framed = framed

    @classmethod
    def from_url(cls, url: str, options: OutputOptions) -> SyslogOutput:
        parts = urlsplit(url)
        kind = parts.scheme.lower().split("+", 1)[1]
        try:
            port = parts.port or DEFAULT_PORTS[kind]
        except ValueError:
            raise OutputError(f"output {redact(url)}: bad port") from None
        host = parts.hostname
        if not host or parts.path not in ("", "/") or parts.fragment:
            raise OutputError(f"output {redact(url)}: expected syslog+{kind}://HOST:PORT")
        query = _query(url, parts.query)
        settings = _message_settings(url, query, options.syslog_format)
        if kind != "tls" and {"ca", "cert", "key"} & set(query):
            raise OutputError(f"output {redact(url)}: ca/cert/key only apply to syslog+tls")
        transport: _Stream | _Datagram
        if kind == "udp":
            transport = _Datagram(host, port)
        else:
            tls = _tls_context(query, url) if kind == "tls" else None
            transport = _Stream(host, port, options.timeout_s, tls)
        return cls(
            f"syslog+{kind}://{host}:{port}",
            transport,
            facility=settings.facility,
            body_format=settings.body_format,
            max_bytes=settings.max_bytes,
            framed=kind != "udp",
        )

    def send(self, alert: Alert) -> None:
        limit = self.max_bytes
        if isinstance(self.transport, _Datagram):
            limit = min(limit, self.transport.limit())
        message = format_message(
            alert, facility=self.facility, body_format=self.body_format, max_bytes=limit
        )
        self.transport.send(octet_frame(message) if self.framed else message)

    def close(self) -> None:
        self.transport.close()

"""`syslog+udp|tcp|tls://HOST[:PORT]`: RFC 5424 messages; TCP and TLS with octet-counted
framing (RFC 6587 3.4.1, RFC 5425), so a message may hold any byte, newlines included.

    <PRI>1 TIMESTAMP HOSTNAME hpcsec PROCID MSGID [hpcsec@32473 id=… rule=… …] BODY

PRI = facility * 8 + severity; the severity comes from rule.level (critical 2 crit, high 3
err, medium 4 warning, low 5 notice, informational 6 info); the facility defaults to authpriv
(10): alerts name users, jobs and paths, and authpriv is where syslog daemons keep security
messages with restricted access. MSGID is the rule id (RFC 5424 allows 32 characters: a UUID
loses its hyphens). The body is the alert as JSON in ASCII (`\\uXXXX` escapes), which RFC 5424
6.4 lets go without a BOM, or CEF, which is UTF-8: a CEF body with non-ASCII characters starts
with the BOM that 6.4 requires of UTF-8 messages. Strings that are not valid UTF-8 (file names
are bytes) are sent with `\\xNN` escapes (encode.py).
Query options: `format=json|cef`, `facility=NAME|NUMBER`, `max_bytes=N` (default 8192, what
rsyslog accepts by default; larger alerts lose `events` first), for TLS `ca=FILE`,
`cert=FILE`, `key=FILE`.
"""

from __future__ import annotations

import errno
import importlib.metadata
import json
import os
import re
import select
import socket
import ssl
from typing import Any
from urllib.parse import parse_qs, urlsplit

from hpcsec.detector.core.jsonenc import cleaned
from hpcsec.detector.core.schema import parse_time, rfc3339
from hpcsec.detector.outputs.base import DeliveryFailed, OutputError, OutputOptions, redact

SD_ID = "hpcsec@32473"  # 32473: the private enterprise number RFC 5612 sets aside for examples
APP_NAME = "hpcsec"
SEVERITY = {"critical": 2, "high": 3, "medium": 4, "low": 5, "informational": 6}
FACILITIES = {
    "kern": 0,
    "user": 1,
    "daemon": 3,
    "auth": 4,
    "security": 4,
    "authpriv": 10,
    **{f"local{i}": 16 + i for i in range(8)},
}
DEFAULT_FACILITY = FACILITIES["authpriv"]
DEFAULT_PORTS = {"udp": 514, "tcp": 514, "tls": 6514}
QUERY_KEYS = ("format", "facility", "max_bytes", "ca", "cert", "key")
CEF_SEVERITY = {"informational": 1, "low": 3, "medium": 5, "high": 8, "critical": 10}
_PRINTUSASCII = re.compile(r"^[\x21-\x7e]+$")
BOM = "\ufeff".encode()
_SD_SPECIAL = re.compile(r'["\\\]]')


def _product_version() -> str:
    try:
        return importlib.metadata.version("hpcsec")
    except importlib.metadata.PackageNotFoundError:
        return "0"


CEF_PRODUCT_VERSION = _product_version()


def sd_escape(value: Any) -> str:
    """PARAM-VALUE escaping of RFC 5424 6.3.3: `"`, `\\` and `]` get a backslash."""
    return _SD_SPECIAL.sub(r"\\\g<0>", str(value))


def header_token(value: Any, limit: int) -> str:
    text = str(value) if value is not None else ""
    return text[:limit] if _PRINTUSASCII.match(text) else "-"


def msgid(rule_id: Any) -> str:
    text = str(rule_id or "")
    if len(text) > 32 and re.fullmatch(r"[0-9a-fA-F-]{36}", text):
        text = text.replace("-", "")
    return header_token(text, 32)


def structured_data(alert: dict[str, Any]) -> str:
    params = (
        ("id", alert.get("alert.id")),
        ("rule", alert.get("rule.id")),
        ("level", alert.get("rule.level")),
        ("vector", alert.get("rule.vector")),
        ("host", alert.get("host.name")),
        ("job", alert.get("slurm.job.id")),
        ("user", alert.get("user.name")),
        ("count", alert.get("count")),
    )
    body = "".join(f' {k}="{sd_escape(v)}"' for k, v in params if v not in (None, ""))
    return f"[{SD_ID}{body}]"


def _cef_header(value: Any) -> str:
    # CEF allows line breaks only in extension values: in the header they become spaces.
    text = str(value).replace("\\", "\\\\").replace("|", "\\|")
    return text.replace("\r\n", " ").replace("\n", " ").replace("\r", " ")


def _cef_value(value: Any) -> str:
    return (
        str(value)
        .replace("\\", "\\\\")
        .replace("=", "\\=")
        .replace("\r", "\\r")
        .replace("\n", "\\n")
    )


def _epoch_ms(value: Any) -> int | None:
    try:
        return int(parse_time(str(value)).timestamp() * 1000)
    except ValueError:
        return None


def cef_body(alert: dict[str, Any]) -> str:
    level = str(alert.get("rule.level"))
    head = "|".join(
        _cef_header(v)
        for v in (
            "CEF:0",
            "hpcsec",
            "hpcsec",
            CEF_PRODUCT_VERSION,
            alert.get("rule.id", ""),
            alert.get("rule.title", ""),
            CEF_SEVERITY.get(level, 5),
        )
    )
    ext = {
        "rt": _epoch_ms(alert.get("@timestamp")),
        "externalId": alert.get("alert.id"),
        "cat": alert.get("rule.vector"),
        "dvchost": alert.get("host.name"),
        "duser": alert.get("user.name"),
        "duid": alert.get("user.id"),
        "dpid": alert.get("process.pid"),
        "dproc": alert.get("process.name"),
        "cnt": alert.get("count"),
        "start": _epoch_ms(alert.get("alert.first_seen")),
        "end": _epoch_ms(alert.get("alert.last_seen")),
        "cs1Label": "slurmJobId",
        "cs1": alert.get("slurm.job.id"),
        "cs2Label": "gpuUuid",
        "cs2": alert.get("gpu.uuid"),
        "cs3Label": "tags",
        "cs3": ",".join(map(str, alert.get("rule.tags") or ())),
        "msg": alert.get("alert.summary"),
    }
    present = {k: v for k, v in ext.items() if v not in (None, "")}
    # a label without its value says nothing
    present = {k: v for k, v in present.items() if not k.endswith("Label") or k[:-5] in present}
    return head + "|" + " ".join(f"{k}={_cef_value(v)}" for k, v in present.items())


def _shrink(alert: dict[str, Any]) -> dict[str, Any]:
    smaller = {k: v for k, v in alert.items() if k != "events"}
    smaller["hpcsec.events_omitted"] = len(alert.get("events") or ())
    return smaller


def _truncate_strings(alert: dict[str, Any], limit: int = 512) -> dict[str, Any]:
    return {
        k: (v[:limit] + "…" if isinstance(v, str) and len(v) > limit else v)
        for k, v in alert.items()
    }


def format_message(
    alert: dict[str, Any],
    *,
    facility: int = DEFAULT_FACILITY,
    body_format: str = "json",
    hostname: str | None = None,
    procid: int | None = None,
    max_bytes: int = 8192,
) -> bytes:
    """One RFC 5424 message (without transport framing)."""
    alert = cleaned(alert)
    severity = SEVERITY.get(str(alert.get("rule.level")), 4)
    try:
        timestamp = rfc3339(parse_time(str(alert.get("@timestamp"))))
    except ValueError:
        timestamp = rfc3339()
    head = (
        f"<{facility * 8 + severity}>1 {timestamp} "
        f"{header_token(hostname or socket.gethostname(), 255)} {APP_NAME} "
        f"{procid if procid is not None else os.getpid()} {msgid(alert.get('rule.id'))} "
        f"{structured_data(alert)} "
    ).encode()
    if body_format == "cef":
        body = cef_body(alert)
        return head + (body.encode() if body.isascii() else BOM + body.encode())
    # Too big for the receiver: drop the evidence events first (they are in the store),
    # then cut long strings; past that the message goes as it is.
    for shrink in (lambda a: a, _shrink, lambda a: _truncate_strings(_shrink(a))):
        body = json.dumps(
            shrink(alert), ensure_ascii=True, separators=(",", ":"), default=str
        ).encode()
        if len(head) + len(body) <= max_bytes:
            break  # the smaller forms are only built when needed
    return head + body


def octet_frame(message: bytes) -> bytes:
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

    def send(self, data: bytes) -> None:
        try:
            if self.sock is not None and self._peer_closed():
                self.close()  # a receiver restart: reconnect rather than write into the void
            if self.sock is None:
                sock = socket.create_connection((self.host, self.port), timeout=self.timeout_s)
                if self.tls is not None:
                    try:
                        sock = self.tls.wrap_socket(sock, server_hostname=self.host)
                    except BaseException:
                        sock.close()
                        raise
                self.sock = sock
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


class _Datagram:
    def __init__(self, host: str, port: int):
        self.host, self.port = host, port
        self.sock: socket.socket | None = None

    def send(self, data: bytes) -> None:
        try:
            if self.sock is None:
                info = socket.getaddrinfo(self.host, self.port, type=socket.SOCK_DGRAM)[0]
                self.sock = socket.socket(info[0], socket.SOCK_DGRAM)
                self.sock.connect(info[4])  # connected: a port-unreachable shows up as an error
            self.sock.send(data)
        except OSError as exc:
            self.close()
            # too big for one datagram: no retry can help this message (lower max_bytes)
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
            raise OutputError(f"output {url!r}: bad port") from None
        if not parts.hostname or parts.path not in ("", "/") or parts.fragment:
            raise OutputError(f"output {url!r}: expected syslog+{kind}://HOST:PORT")
        raw = parse_qs(parts.query, keep_blank_values=True)
        unknown = sorted(set(raw) - set(QUERY_KEYS))
        if unknown:
            raise OutputError(
                f"output {url!r}: unknown option(s) {', '.join(unknown)} "
                f"(expected: {', '.join(QUERY_KEYS)})"
            )
        query = {k: v[-1] for k, v in raw.items()}
        body_format = query.get("format", options.syslog_format)
        if body_format not in ("json", "cef"):
            raise OutputError(f"output {url!r}: format must be json or cef")
        facility_name = query.get("facility", "authpriv")
        facility = (
            int(facility_name)
            if facility_name.isdigit()
            else FACILITIES.get(facility_name.lower(), -1)
        )
        if not 0 <= facility <= 23:
            raise OutputError(f"output {url!r}: unknown facility {facility_name!r}")
        try:
            max_bytes = int(query.get("max_bytes", "8192"))
        except ValueError:
            raise OutputError(f"output {url!r}: max_bytes must be a number") from None
        if kind != "tls" and {"ca", "cert", "key"} & set(query):
            raise OutputError(f"output {url!r}: ca/cert/key only apply to syslog+tls")
        host = parts.hostname
        transport: _Stream | _Datagram
        if kind == "udp":
            transport = _Datagram(host, port)
        else:
            tls = _tls_context(query, url) if kind == "tls" else None
            transport = _Stream(host, port, options.timeout_s, tls)
        name = f"syslog+{kind}://{host}:{port}"
        return cls(
            name,
            transport,
            facility=facility,
            body_format=body_format,
            max_bytes=max_bytes,
            framed=kind != "udp",
        )

    def send(self, alert: dict[str, Any]) -> None:
        message = format_message(
            alert, facility=self.facility, body_format=self.body_format, max_bytes=self.max_bytes
        )
        self.transport.send(octet_frame(message) if self.framed else message)

    def close(self) -> None:
        self.transport.close()

"""RFC 5424 syslog messages for alerts (the transport, framing included, is syslog.py).

    <PRI>1 TIMESTAMP HOSTNAME hpcsec PROCID MSGID [hpcsec@32473 id=… rule=… …] BODY

PRI = facility * 8 + severity; the severity comes from rule.level (critical 2 crit, high 3
err, medium 4 warning, low 5 notice, informational 6 info); the facility defaults to authpriv
(10): alerts name users, jobs and paths, and authpriv is where syslog daemons keep security
messages with restricted access. MSGID is the rule id (RFC 5424 allows 32 characters: a UUID
loses its hyphens). The body is the alert as JSON in ASCII (`\\uXXXX` escapes), which RFC 5424
6.4 lets go without a BOM, or CEF (cef.py), which is UTF-8: a CEF body with non-ASCII
characters starts with the BOM that 6.4 requires of UTF-8 messages. Strings that are not valid
UTF-8 (file names are bytes) are sent with `\\xNN` escapes (core/jsonenc.py).
"""

from __future__ import annotations

import json
import os
import re
import socket
from typing import Any

from hpcsec.detector.core.display import visible, visible_json
from hpcsec.detector.core.schema import parse_time, rfc3339
from hpcsec.detector.outputs.alertjson import alert_dict, json_default
from hpcsec.detector.outputs.cef import cef_body
from hpcsec.detector.outputs.fit import cut_text, fit
from hpcsec.detector.outputs.protocol import Alert

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
DEFAULT_MAX_BYTES = 8192  # what rsyslog accepts by default
MIN_MAX_BYTES = 2048  # the header and the identifying fields of a cut alert always fit
SD_VALUE_CHARS = 128
BOM = "\ufeff".encode()
_PRINTUSASCII = re.compile(r"^[\x21-\x7e]+$")
_SD_SPECIAL = re.compile(r'["\\\]]')


def sd_escape(value: Any) -> str:
    """PARAM-VALUE escaping of RFC 5424 6.3.3 (`"`, `\\` and `]` get a backslash) of the value
    with its controls and invisible characters as visible escapes, cut to SD_VALUE_CHARS: the
    structured data only helps a receiver route; the whole values are in the body."""
    text = cut_text(visible(value), SD_VALUE_CHARS)
    return _SD_SPECIAL.sub(r"\\\g<0>", text)


def header_token(value: Any, limit: int) -> str:
    text = str(value) if value is not None else ""
    return text[:limit] if _PRINTUSASCII.match(text) else "-"


def msgid(rule_id: Any) -> str:
    text = str(rule_id or "")
    if len(text) > 32 and re.fullmatch(r"[0-9a-fA-F-]{36}", text):
        text = text.replace("-", "")
    return header_token(text, 32)


def structured_data(alert: Alert) -> str:
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


def _json_body(alert: Alert) -> bytes:
    # ASCII JSON has every C0 control and non-ASCII character as an escape; DEL is ASCII and
    # the one raw control left: visible_json writes it as \u007f too.
    text = json.dumps(alert, ensure_ascii=True, separators=(",", ":"), default=json_default)
    return visible_json(text.encode())


def _cef_bytes(alert: Alert) -> bytes:
    body = cef_body(alert)
    return body.encode() if body.isascii() else BOM + body.encode()


def format_message(
    alert: Alert,
    *,
    facility: int = DEFAULT_FACILITY,
    body_format: str = "json",
    hostname: str | None = None,
    procid: int | None = None,
    max_bytes: int = DEFAULT_MAX_BYTES,
) -> bytes:
    """One RFC 5424 message (without transport framing)."""
    fields = alert_dict(alert)  # a copy: the caller's alert is never changed
    severity = SEVERITY.get(str(fields.get("rule.level")), 4)
    try:
        timestamp = rfc3339(parse_time(str(fields.get("@timestamp"))))
    except ValueError:
        timestamp = rfc3339()
    head = (
        f"<{facility * 8 + severity}>1 {timestamp} "
        f"{header_token(hostname or socket.gethostname(), 255)} {APP_NAME} "
        f"{procid if procid is not None else os.getpid()} {msgid(fields.get('rule.id'))} "
        f"{structured_data(fields)} "
    ).encode()
    encode = _cef_bytes if body_format == "cef" else _json_body
    return head + fit(fields, encode, max_bytes - len(head))

"""CEF (ArcSight Common Event Format) body of a syslog message, for SIEMs that parse CEF.

    CEF:0|hpcsec|hpcsec|VERSION|rule.id|rule.title|SEVERITY|key=value key=value …

The header escapes `\\` and `|` and turns line breaks into spaces (CEF allows them only in
extension values); extension values escape `\\` and `=` and write line breaks as `\\n`/`\\r`.
Every other control character (C0, DEL, C1) and invisible format character (bidi controls,
zero-width characters, BOM) is written as the visible escape of core/display.py (`\\x1b`,
`\\u202e`), with its backslash escaped like any other: no raw control byte reaches the SIEM.
"""

from __future__ import annotations

import importlib.metadata
import re
from typing import Any

from hpcsec.detector.core.display import visible
from hpcsec.detector.core.schema import parse_time
from hpcsec.detector.outputs.protocol import Alert

CEF_SEVERITY = {"informational": 1, "low": 3, "medium": 5, "high": 8, "critical": 10}


def _product_version() -> str:
    try:
        return importlib.metadata.version("hpcsec")
    except importlib.metadata.PackageNotFoundError:
        return "0"


CEF_PRODUCT_VERSION = _product_version()


def _header_field(value: Any) -> str:
    text = re.sub(r"\r\n|[\r\n]", " ", str(value))
    return visible(text).replace("\\", "\\\\").replace("|", "\\|")


_EXTENSION_BREAKS = {"\r": "\\r", "\n": "\\n"}


def _extension_value(value: Any) -> str:
    # Line breaks as CEF's \r and \n; every other control or invisible character as the
    # visible escape of core.display, its backslash escaped like any other (`\\x1b`).
    return "".join(
        _EXTENSION_BREAKS.get(part) or visible(part).replace("\\", "\\\\").replace("=", "\\=")
        for part in re.split(r"([\r\n])", str(value))
        if part
    )


def _epoch_ms(value: Any) -> int | None:
    try:
        return int(parse_time(str(value)).timestamp() * 1000)
    except ValueError:
        return None


def _extensions(alert: Alert) -> dict[str, Any]:
    """The extension fields the alert has values for, in CEF's customary order."""
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
    return {k: v for k, v in present.items() if not k.endswith("Label") or k[:-5] in present}


def cef_body(alert: Alert) -> str:
    level = str(alert.get("rule.level"))
    head = "|".join(
        _header_field(v)
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
    extensions = " ".join(f"{k}={_extension_value(v)}" for k, v in _extensions(alert).items())
    return head + "|" + extensions

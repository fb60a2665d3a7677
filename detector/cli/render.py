"""Alerts for people (a coloured table) and for pipes (JSON, JSONL)."""

from __future__ import annotations

import re
import sys
from collections.abc import Mapping, Sequence
from typing import Any, TextIO

import orjson

from hpcsec.detector.core.jsonenc import dumps  # file names from the kernel may not be valid UTF-8
from hpcsec.detector.core.timefmt import parse_time

# C0 and C1 controls and DEL: a user name or command line with an escape sequence must not
# drive the terminal of the admin reading the alerts.
_CONTROLS = re.compile(r"[\x00-\x1f\x7f-\x9f]")

LEVEL_STYLE = {
    "critical": "bold white on red",
    "high": "bold red",
    "medium": "yellow",
    "low": "cyan",
    "informational": "dim",
}


def printable(value: Any) -> str:
    """Node data as inert text for a terminal: control characters shown as `\\xNN`."""
    return _CONTROLS.sub(lambda m: f"\\x{ord(m[0]):02x}", str(value))


def display_time(value: Any) -> str:
    """An event time as `YYYY-MM-DD HH:MM:SS` UTC; text that is not a time, as it is."""
    try:
        return parse_time(value).strftime("%Y-%m-%d %H:%M:%S")
    except ValueError:
        return printable(value or "")


def write_json(alerts: Sequence[Mapping[str, Any]], out: TextIO | None = None) -> None:
    out = out or sys.stdout
    out.write(dumps(alerts, option=orjson.OPT_INDENT_2).decode() + "\n")


def write_jsonl(alerts: Sequence[Mapping[str, Any]], out: TextIO | None = None) -> None:
    out = out or sys.stdout
    for alert in alerts:
        out.write(dumps(alert).decode() + "\n")


def write_table(
    alerts: Sequence[Mapping[str, Any]], out: TextIO | None = None, title: str | None = None
) -> None:
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    def cell(value: Any) -> str:  # rich reads `[...]` in a cell as markup: node data is not
        return escape(printable(value))

    out = out or sys.stdout
    # Piped output (CI logs, `| less`) gets a wide table instead of rich's 80 columns.
    width = None if out.isatty() else 220
    console = Console(file=out, soft_wrap=False, width=width)
    table = Table(title=title, show_lines=False, expand=False)
    for column in ("time", "level", "vector"):
        table.add_column(column, no_wrap=True)
    table.add_column("rule", overflow="fold", max_width=40)
    for column in ("host", "job", "user"):
        table.add_column(column, no_wrap=True)
    table.add_column("summary", overflow="fold")
    for a in alerts:
        style = LEVEL_STYLE.get(a["rule.level"], "")
        count = f" (x{a['count']})" if a.get("count", 1) > 1 else ""
        summary = a.get("alert.summary") or ""
        summary = summary.removeprefix(a["rule.title"] + ": ")  # the rule column says it
        level = cell(a["rule.level"])
        table.add_row(
            cell(display_time(a.get("@timestamp"))),
            f"[{style}]{level}[/]" if style else level,
            cell(a.get("rule.vector") or ""),
            cell(a["rule.title"]),
            cell(a.get("host.name") or ""),
            cell(a.get("slurm.job.id") or "-"),
            cell(a.get("user.name") or a.get("slurm.job.user") or "-"),
            cell(summary + count),
        )
    console.print(table)

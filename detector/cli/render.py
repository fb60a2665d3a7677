"""Alerts for people (a coloured table) and for pipes (JSON, JSONL)."""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from typing import Any, TextIO

import orjson

from hpcsec.detector.core.display import visible, visible_json
from hpcsec.detector.core.jsonenc import dumps  # file names from the kernel may not be valid UTF-8
from hpcsec.detector.core.timefmt import parse_time

LEVEL_STYLE = {
    "critical": "bold white on red",
    "high": "bold red",
    "medium": "yellow",
    "low": "cyan",
    "informational": "dim",
}


def display_time(value: Any) -> str:
    """An event time as `YYYY-MM-DD HH:MM:SS` UTC; text that is not a time, as it is."""
    try:
        return parse_time(value).strftime("%Y-%m-%d %H:%M:%S")
    except ValueError:
        return visible(value or "")


def write_json(alerts: Sequence[Mapping[str, Any]], out: TextIO | None = None) -> None:
    out = out or sys.stdout
    out.write(visible_json(dumps(alerts, option=orjson.OPT_INDENT_2)).decode() + "\n")


def write_jsonl(alerts: Sequence[Mapping[str, Any]], out: TextIO | None = None) -> None:
    out = out or sys.stdout
    for alert in alerts:
        out.write(visible_json(dumps(alert)).decode() + "\n")


def write_table(
    alerts: Sequence[Mapping[str, Any]], out: TextIO | None = None, title: str | None = None
) -> None:
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    def cell(value: Any, style: str = "") -> Text:
        # A Text is never read as markup (`[link=…]`, `[black on black]`, `[/x]` stay text)
        # nor as emoji codes; `visible` escapes what a terminal would obey or not show.
        return Text(visible(value), style=style)

    out = out or sys.stdout
    # Piped output (CI logs, `| less`) gets a wide table instead of rich's 80 columns.
    width = None if out.isatty() else 220
    console = Console(file=out, soft_wrap=False, width=width)
    table = Table(title=cell(title) if title else None, show_lines=False, expand=False)
    for column in ("time", "level", "vector"):
        table.add_column(column, no_wrap=True)
    table.add_column("rule", overflow="fold", max_width=40)
    for column in ("host", "job", "user"):
        # bounded: a node's user or host name of any length must not squeeze the rule away
        table.add_column(column, no_wrap=True, max_width=80, overflow="ellipsis")
    table.add_column("summary", overflow="fold")
    for a in alerts:
        count = f" (x{a['count']})" if a.get("count", 1) > 1 else ""
        summary = a.get("alert.summary") or ""
        summary = summary.removeprefix(a["rule.title"] + ": ")  # the rule column says it
        table.add_row(
            cell(display_time(a.get("@timestamp"))),
            cell(a["rule.level"], LEVEL_STYLE.get(a["rule.level"], "")),
            cell(a.get("rule.vector") or ""),
            cell(a["rule.title"]),
            cell(a.get("host.name") or ""),
            cell(a.get("slurm.job.id") or "-"),
            cell(a.get("user.name") or a.get("slurm.job.user") or "-"),
            cell(summary + count),
        )
    console.print(table)

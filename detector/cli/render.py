"""Alerts for people (a coloured table) and for pipes (JSON, JSONL)."""

from __future__ import annotations

import sys
from typing import Any, TextIO

import orjson

from hpcsec.detector.core.jsonenc import dumps  # file names from the kernel may not be valid UTF-8

LEVEL_STYLE = {
    "critical": "bold white on red",
    "high": "bold red",
    "medium": "yellow",
    "low": "cyan",
    "informational": "dim",
}


def write_json(alerts: list[dict[str, Any]], out: TextIO | None = None) -> None:
    out = out or sys.stdout
    out.write(dumps(alerts, option=orjson.OPT_INDENT_2).decode() + "\n")


def write_jsonl(alerts: list[dict[str, Any]], out: TextIO | None = None) -> None:
    out = out or sys.stdout
    for alert in alerts:
        out.write(dumps(alert).decode() + "\n")


def write_table(
    alerts: list[dict[str, Any]], out: TextIO | None = None, title: str | None = None
) -> None:
    from rich.console import Console
    from rich.table import Table

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
        table.add_row(
            (a.get("@timestamp") or "")[:19].replace("T", " "),
            f"[{style}]{a['rule.level']}[/]" if style else a["rule.level"],
            a.get("rule.vector") or "",
            a["rule.title"],
            a.get("host.name") or "",
            str(a.get("slurm.job.id") or "-"),
            str(a.get("user.name") or a.get("slurm.job.user") or "-"),
            summary + count,
        )
    console.print(table)

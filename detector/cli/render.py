"""Alerts for people (a coloured table that fits the terminal) and for pipes (JSON, JSONL).

The table is as wide as the terminal, or `COLUMNS`, or 120 columns when the output is not a
terminal (a CI log, `| less`). Below WIDE columns it merges host, job and user into one
column and the vector into the rule's cell, below NARROW time and level share one column too,
so rule and summary keep room to wrap instead of being squeezed to a few characters.
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TextIO

import orjson

from hpcsec.detector.core.display import visible, visible_json
from hpcsec.detector.core.jsonenc import dumps  # file names from the kernel may not be valid UTF-8
from hpcsec.detector.core.schema import LEVELS
from hpcsec.detector.core.timefmt import parse_time, year_first

LEVEL_STYLE = {
    "critical": "bold white on red",
    "high": "bold red",
    "medium": "yellow",
    "low": "cyan",
    "informational": "dim",
}


PIPE_WIDTH = 120  # output that is not a terminal, without COLUMNS
WIDE = 150  # from this width on, every field has its own column
NARROW = 100  # below it, time and level share a column, and rule, host, job and user
NAMED_TECHNIQUES = 150  # from this width on, techniques are shown with their names
MIN_WIDTH, MAX_WIDTH = 60, 1000


def display_time(value: Any) -> str:
    """An event time as `YYYY-MM-DD HH:MM:SSZ` (UTC, and says so); text that is not a time,
    as it is."""
    try:
        return year_first(parse_time(value)) + "Z"
    except ValueError:
        return visible(value or "")


def write_json(alerts: Sequence[Mapping[str, Any]], out: TextIO | None = None) -> None:
    out = out or sys.stdout
    out.write(visible_json(dumps(alerts, option=orjson.OPT_INDENT_2)).decode() + "\n")


def write_jsonl(alerts: Sequence[Mapping[str, Any]], out: TextIO | None = None) -> None:
    out = out or sys.stdout
    for alert in alerts:
        out.write(visible_json(dumps(alert)).decode() + "\n")


def table_width(out: TextIO, environ: Mapping[str, str] | None = None) -> int:
    """`COLUMNS` when set to a number, else the terminal's width, else PIPE_WIDTH."""
    env = os.environ if environ is None else environ
    text = env.get("COLUMNS", "").strip()
    if text.isdigit():
        return max(MIN_WIDTH, min(int(text), MAX_WIDTH))
    isatty = getattr(out, "isatty", None)
    if isatty is not None and isatty():
        return max(MIN_WIDTH, shutil.get_terminal_size((PIPE_WIDTH, 24)).columns)
    return PIPE_WIDTH


def _technique_line(alert: Mapping[str, Any], named: bool) -> str:
    entries = alert.get("rule.techniques") or []
    if not isinstance(entries, list):
        return ""
    parts = []
    for entry in entries:
        if not isinstance(entry, Mapping) or not entry.get("id"):
            continue
        name = entry.get("name")
        parts.append(f"{entry['id']} {name}" if named and name else str(entry["id"]))
    return ("; " if named else " ").join(parts)


def _summary(alert: Mapping[str, Any]) -> str:
    count = alert.get("count", 1)
    more = f" (x{count})" if isinstance(count, int) and count > 1 else ""
    summary = str(alert.get("alert.summary") or "")
    title = str(alert.get("rule.title") or "")
    return summary.removeprefix(title + ": ") + more  # the rule column says it


LEVELED = ("level", "time/level")  # the cells coloured by the alert's level


@dataclass(frozen=True)
class Column:
    header: str
    text: Callable[[Mapping[str, Any]], str | list[str]]  # a list: the cell's lines
    no_wrap: bool = False
    min_width: int | None = None
    max_width: int | None = None


# A node's user or host name of any length must not fill the screen or squeeze the rule away.
NAME_CAP = 80


def _dash(value: Any) -> str:
    if value is None or value == "":
        return "-"
    text = str(value)
    return text if len(text) <= NAME_CAP else text[: NAME_CAP - 1] + "…"


def _user(alert: Mapping[str, Any]) -> str:
    return _dash(alert.get("user.name") or alert.get("slurm.job.user"))


def _where(alert: Mapping[str, Any]) -> list[str]:
    """Host, job and user stacked in one cell (narrow tables)."""
    return [_dash(alert.get("host.name")), f"job {_dash(alert.get('slurm.job.id'))}", _user(alert)]


def alert_columns(width: int, extra: Sequence[Column] = ()) -> list[Column]:
    """The columns for a table `width` characters wide (see the module's docstring); `extra`
    go before the summary."""
    named = width >= NAMED_TECHNIQUES

    def rule(a: Mapping[str, Any]) -> list[str]:
        lines = [str(a.get("rule.title") or a.get("rule.id") or "")]
        if width < WIDE and a.get("rule.vector"):
            lines.append(str(a["rule.vector"]))
        techniques = _technique_line(a, named)
        return lines + ([techniques] if techniques else [])

    head = [
        Column("time", lambda a: display_time(a.get("@timestamp")), no_wrap=True),
        Column("level", lambda a: str(a.get("rule.level") or ""), no_wrap=True),
    ]
    if width >= WIDE:
        return [
            *head,
            Column("vector", lambda a: str(a.get("rule.vector") or ""), no_wrap=True),
            Column("rule", rule, min_width=18, max_width=44),
            Column("host", lambda a: _dash(a.get("host.name")), max_width=max(24, width // 6)),
            Column("job", lambda a: _dash(a.get("slurm.job.id")), max_width=12),
            Column("user", _user, max_width=max(32, width // 4)),
            *extra,
            Column("summary", _summary, min_width=24),
        ]
    if width >= NARROW:
        return [
            *head,
            Column("rule", rule, min_width=16),
            Column("host/job/user", _where, min_width=12, max_width=20),
            *extra,
            Column("summary", _summary, min_width=20),
        ]

    def when(a: Mapping[str, Any]) -> list[str]:
        return [display_time(a.get("@timestamp")), str(a.get("rule.level") or "")]

    def rule_and_where(a: Mapping[str, Any]) -> list[str]:
        return [*rule(a), " / ".join(_where(a))]

    return [
        Column("time/level", when, min_width=11, max_width=20),
        Column("rule, host/job/user", rule_and_where, min_width=14),
        *extra,
        Column("summary", _summary, min_width=16),
    ]


def write_table(
    alerts: Sequence[Mapping[str, Any]],
    out: TextIO | None = None,
    title: str | None = None,
    *,
    width: int | None = None,
    extra: Sequence[Column] = (),
) -> None:
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    def cell(value: Any, style: str = "") -> Text:
        # A Text is never read as markup (`[link=…]`, `[black on black]`, `[/x]` stay text)
        # nor as emoji codes; `visible` escapes what a terminal would obey or not show.
        # A list is the lines of a cell; a line break inside a value is escaped like any control.
        lines = value if isinstance(value, list) else [value]
        return Text("\n".join(visible(line) for line in lines), style=style)

    out = out or sys.stdout
    width = width or table_width(out)
    console = Console(file=out, soft_wrap=False, width=width)
    table = Table(title=cell(title) if title else None, show_lines=width < WIDE, expand=False)
    columns = alert_columns(width, extra)
    for column in columns:
        table.add_column(
            column.header,
            no_wrap=column.no_wrap,
            overflow="fold",
            min_width=column.min_width,
            max_width=column.max_width,
        )
    for a in alerts:
        level = str(a.get("rule.level") or "")
        table.add_row(
            *(
                cell(c.text(a), LEVEL_STYLE.get(level, "") if c.header in LEVELED else "")
                for c in columns
            )
        )
    console.print(table)


def level_counts(alerts: Iterable[Mapping[str, Any]]) -> str:
    """`2 critical, 1 high`: alerts per level, most severe first."""
    counts: dict[str, int] = {}
    for a in alerts:
        level = str(a.get("rule.level") or "unknown")
        counts[level] = counts.get(level, 0) + 1
    order = [*reversed(LEVELS), *sorted(set(counts) - set(LEVELS))]
    return ", ".join(f"{counts[level]} {visible(level)}" for level in order if level in counts)


def footer(
    alerts: Sequence[Mapping[str, Any]],
    unavailable: Sequence[str] = (),
    failing: Sequence[str] = (),
    hidden: int = 0,
) -> str:
    """One line under the table: alerts per level, what was not shown, blind spots."""
    parts = [f"{len(alerts)} alert(s)" + (f": {level_counts(alerts)}" if alerts else "")]
    if hidden:
        parts.append(f"{hidden} below --min-level (stored only)")
    if unavailable:
        parts.append("unavailable: " + ", ".join(visible(n) for n in unavailable))
    if failing:
        parts.append("failing: " + ", ".join(visible(n) for n in failing))
    return "hpcsec: " + " | ".join(parts)

"""Incidents for people: one row per incident (`--incidents`), one incident as a timeline
(`--incident ID`), and both as JSON for pipes. Shared by `scan` and `alerts`."""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from typing import Any, TextIO

import orjson

from hpcsec.detector.alerts.incidents import IncidentSummary, timeline
from hpcsec.detector.cli.render import LEVEL_STYLE, display_time
from hpcsec.detector.core.display import visible, visible_json
from hpcsec.detector.core.jsonenc import dumps


def _joined(values: Sequence[str]) -> str:
    return ", ".join(values) if values else "-"


def write_incidents_json(incidents: Sequence[IncidentSummary], out: TextIO | None = None) -> None:
    out = out or sys.stdout
    rows = [i.as_dict() for i in incidents]
    out.write(visible_json(dumps(rows, option=orjson.OPT_INDENT_2)).decode() + "\n")


def _console(out: TextIO) -> Any:
    from rich.console import Console

    # piped output (CI logs, `| less`) gets a wide table instead of rich's 80 columns
    return Console(file=out, soft_wrap=False, width=None if out.isatty() else 220)


def write_incidents_table(
    incidents: Sequence[IncidentSummary], out: TextIO | None = None, title: str | None = None
) -> None:
    from rich.table import Table
    from rich.text import Text

    def cell(value: Any, style: str = "") -> Text:
        return Text(visible(value), style=style)  # a Text is never read as markup

    out = out or sys.stdout
    table = Table(title=cell(title) if title else None, expand=False)
    for column in ("incident", "level", "first", "last", "host", "job", "user", "vectors"):
        table.add_column(column, no_wrap=column != "vectors", overflow="fold")
    table.add_column("alerts", justify="right", no_wrap=True)
    table.add_column("matches", justify="right", no_wrap=True)
    for i in incidents:
        table.add_row(
            cell(i.ident),
            cell(i.level, LEVEL_STYLE.get(i.level, "")),
            cell(display_time(i.first)),
            cell(display_time(i.last)),
            cell(_joined(i.hosts)),
            cell(_joined(i.jobs)),
            cell(_joined(i.users)),
            cell(_joined(i.vectors)),
            cell(len(i.alerts)),
            cell(i.count),
        )
    _console(out).print(table)


def write_timeline(
    ident: str, alerts: Sequence[Mapping[str, Any]], out: TextIO | None = None
) -> None:
    """One incident: who, job, node, then its alerts in the order they happened."""
    from rich.table import Table
    from rich.text import Text

    def cell(value: Any, style: str = "") -> Text:
        return Text(visible(value), style=style)

    out = out or sys.stdout
    ordered = timeline(alerts)
    users = {str(a.get("user.name")) for a in ordered if a.get("user.name")}
    jobs = {str(a.get("slurm.job.id")) for a in ordered if a.get("slurm.job.id")}
    hosts = {str(a.get("host.name")) for a in ordered if a.get("host.name")}
    title = (
        f"incident {ident}: host {_joined(sorted(hosts))}, job {_joined(sorted(jobs))}, "
        f"user {_joined(sorted(users))}, {len(ordered)} alert(s)"
    )
    table = Table(title=cell(title), expand=False)
    for column in ("first seen", "last seen", "level", "vector", "rule"):
        table.add_column(column, no_wrap=column != "rule", overflow="fold")
    table.add_column("summary", overflow="fold")
    for a in ordered:
        count = f" (x{a['count']})" if int(a.get("count") or 1) > 1 else ""
        summary = str(a.get("alert.summary") or "").removeprefix(f"{a.get('rule.title')}: ")
        level = str(a.get("rule.level"))
        table.add_row(
            cell(display_time(a.get("alert.first_seen") or a.get("@timestamp"))),
            cell(display_time(a.get("alert.last_seen") or a.get("@timestamp"))),
            cell(level, LEVEL_STYLE.get(level, "")),
            cell(a.get("rule.vector") or ""),
            cell(a.get("rule.title") or a.get("rule.id") or ""),
            cell(summary + count),
        )
    _console(out).print(table)

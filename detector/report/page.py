"""`hpcsec report`: one self-contained HTML page for people.

No script, no external asset: inline CSS, inline SVG, and a Content-Security-Policy that
would block anything else a hostile string managed to plant. Every value that comes from a
node (user, host, job, command line, summary) goes through `esc` before it is written.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from hpcsec.detector.alerts.incidents import IncidentSummary, summarize_incidents
from hpcsec.detector.alerts.model import highest_level, level_rank
from hpcsec.detector.core.schema import LEVELS
from hpcsec.detector.core.timefmt import parse_time, year_first
from hpcsec.detector.report.gather import ReportInput
from hpcsec.detector.report.svg import (
    alerts_over_time,
    esc,
    node_vector_heatmap,
    short,
    vector_colors,
)

OPEN_INCIDENTS = 10  # shown unfolded; the rest are one line each until clicked
MAX_SHOWN = 500
CSP = "default-src 'none'; style-src 'unsafe-inline'; img-src data:"
LEVEL_COLORS = {
    "critical": "#8b0000",
    "high": "#d55e00",
    "medium": "#b8860b",
    "low": "#0072b2",
    "informational": "#666666",
}
STYLE = """
body{font:14px/1.45 system-ui,sans-serif;margin:24px auto;max-width:1200px;color:#222;
padding:0 16px}
h1{font-size:22px;margin:0 0 4px}h2{font-size:18px;margin:28px 0 8px;border-bottom:1px solid #ccc}
table{border-collapse:collapse;margin:6px 0 12px}th,td{padding:3px 8px;text-align:left;
vertical-align:top;border-bottom:1px solid #eee}th{background:#f4f4f4}
td.num,th.num{text-align:right}.meta{color:#555}.lvl{color:#fff;border-radius:3px;padding:0 6px;
white-space:nowrap}.sw{display:inline-block;width:10px;height:10px;margin-right:5px}
.cards{display:flex;gap:24px;flex-wrap:wrap}details{margin:6px 0;border:1px solid #ddd;
border-radius:4px;padding:4px 10px}summary{cursor:pointer}code{word-break:break-all}
.empty{color:#777}
"""


def _level(level: Any) -> str:
    color = LEVEL_COLORS.get(str(level), "#666666")
    return f'<span class="lvl" style="background:{color}">{esc(level)}</span>'


def _time(value: Any) -> str:
    try:
        return year_first(parse_time(str(value))) + " UTC"
    except ValueError:
        return esc(value or "-")


def _list(values: Iterable[Any]) -> str:
    shown = [esc(short(v)) for v in values if v not in (None, "")]
    return ", ".join(shown) if shown else "-"


def _table(head: Sequence[str], rows: Iterable[Sequence[str]], numeric: set[int]) -> str:
    """A table of cells already escaped (or made here from escaped parts)."""

    def tag(name: str, i: int, text: str) -> str:
        return (
            f'<{name} class="num">{text}</{name}>' if i in numeric else f"<{name}>{text}</{name}>"
        )

    out = ["<table><tr>", *(tag("th", i, esc(h)) for i, h in enumerate(head)), "</tr>"]
    for row in rows:
        out += ["<tr>", *(tag("td", i, c) for i, c in enumerate(row)), "</tr>"]
    out.append("</table>")
    return "".join(out)


def _counts(alerts: Sequence[Mapping[str, Any]], colors: Mapping[str, str]) -> str:
    levels = Counter(str(a.get("rule.level")) for a in alerts)
    vectors = Counter(str(a.get("rule.vector")) for a in alerts)
    level_rows = [
        [_level(lv), str(levels[lv])] for lv in sorted(levels, key=level_rank, reverse=True)
    ]
    vector_rows = [
        [f'<span class="sw" style="background:{colors[v]}"></span>{esc(v)}', str(n)]
        for v, n in sorted(vectors.items(), key=lambda kv: (-kv[1], kv[0]))
    ]
    return (
        '<div class="cards"><div><h3>Per level</h3>'
        + _table(["level", "alerts"], level_rows, {1})
        + "</div><div><h3>Per vector</h3>"
        + _table(["vector", "alerts"], vector_rows, {1})
        + "</div></div>"
    )


def _grouped(alerts: Sequence[Mapping[str, Any]], key: str) -> dict[str, list[Mapping[str, Any]]]:
    groups: dict[str, list[Mapping[str, Any]]] = {}
    for alert in alerts:
        value = alert.get(key)
        if value not in (None, ""):
            groups.setdefault(str(value), []).append(alert)
    return groups


def _distinct(alerts: Iterable[Mapping[str, Any]], key: str) -> list[str]:
    return sorted({str(a[key]) for a in alerts if a.get(key) not in (None, "")})


def _per_job(alerts: Sequence[Mapping[str, Any]]) -> str:
    groups = _grouped(alerts, "slurm.job.id")
    if not groups:
        return '<p class="empty">No alert is tied to a Slurm job.</p>'
    rows = [
        [
            esc(job),
            _list(_distinct(members, "user.name") or _distinct(members, "slurm.job.user")),
            _list(_distinct(members, "host.name")),
            _level(highest_level(members, default="informational")),
            _list(_distinct(members, "rule.vector")),
            str(len(members)),
            str(len(_distinct(members, "incident.id"))),
        ]
        for job, members in sorted(groups.items())
    ]
    head = ["job", "users", "nodes", "highest level", "vectors", "alerts", "incidents"]
    return _table(head, rows, {5, 6})


def _per_node(alerts: Sequence[Mapping[str, Any]]) -> str:
    rows = [
        [
            esc(short(node)),
            _level(highest_level(members, default="informational")),
            _list(_distinct(members, "rule.vector")),
            _list(_distinct(members, "slurm.job.id")),
            _list(_distinct(members, "user.name")),
            str(len(members)),
        ]
        for node, members in sorted(_grouped(alerts, "host.name").items())
    ]
    head = ["node", "highest level", "vectors", "jobs", "users", "alerts"]
    return _table(head, rows, {5})


def _incident(incident: IncidentSummary, open_: bool) -> str:
    head = (
        f"{_level(incident.level)} <b>{esc(incident.ident)}</b>: "
        f"node {_list(incident.hosts)}, job {_list(incident.jobs)}, "
        f"user {_list(incident.users)}, {_list(incident.vectors)}, "
        f"{len(incident.alerts)} alert(s), {_time(incident.first)} to {_time(incident.last)}"
    )
    rows = []
    for a in incident.alerts:
        summary = str(a.get("alert.summary") or "").removeprefix(f"{a.get('rule.title')}: ")
        count = int(a.get("count") or 1)
        rows.append(
            [
                _time(a.get("alert.first_seen") or a.get("@timestamp")),
                _level(a.get("rule.level")),
                esc(a.get("rule.vector")),
                esc(a.get("rule.title") or a.get("rule.id")),
                f"<code>{esc(summary)}</code>" + (f" (x{count})" if count > 1 else ""),
            ]
        )
    table = _table(["first seen", "level", "vector", "rule", "what"], rows, set())
    return f"<details{' open' if open_ else ''}><summary>{head}</summary>{table}</details>"


def _incidents(incidents: Sequence[IncidentSummary]) -> str:
    if not incidents:
        return '<p class="empty">No incidents.</p>'
    shown = "".join(_incident(i, n < OPEN_INCIDENTS) for n, i in enumerate(incidents[:MAX_SHOWN]))
    rest = len(incidents) - MAX_SHOWN
    if rest > 0:  # a flood of alerts must not make a page no browser opens
        shown += f'<p class="empty">{rest} less severe incident(s) not shown.</p>'
    return shown


def render(data: ReportInput, generated: str) -> str:
    """The whole page."""
    alerts = data.alerts
    incidents = summarize_incidents(alerts)
    vectors = sorted({str(a.get("rule.vector")) for a in alerts})
    colors = vector_colors(vectors)
    worst = highest_level(alerts, default="informational") if alerts else None
    facts = [
        f"{len(alerts)} alert(s) in {len(incidents)} incident(s)",
        f"{len(_distinct(alerts, 'host.name'))} node(s)",
        f"{len(_distinct(alerts, 'slurm.job.id'))} job(s)",
    ]
    if data.events is not None:
        facts.append(f"{data.events} event(s) evaluated")
    if data.held_back:
        facts.append(f"{data.held_back} alert(s) held back by silences or rate limits")
    notes = "".join(f"<li>{esc(n.removeprefix('hpcsec: '))}</li>" for n in data.notes)
    body = [
        f"<h1>hpcsec report{f' {_level(worst)}' if worst else ''}</h1>",
        f'<p class="meta">{esc(data.source)}; generated {esc(generated)}</p>',
        f"<p>{esc('; '.join(facts))}</p>",
        "<h2>Counts</h2>",
        _counts(alerts, colors),
        "<h2>Alerts over time, by vector</h2>",
        alerts_over_time(alerts, colors),
        "<h2>Nodes and vectors</h2>",
        node_vector_heatmap(alerts, vectors),
        "<h2>Incidents</h2>",
        _incidents(incidents),
        "<h2>Per job</h2>",
        _per_job(alerts),
        "<h2>Per node</h2>",
        _per_node(alerts),
    ]
    if notes:
        body += ["<h2>What the scan read</h2>", f'<ul class="meta">{notes}</ul>']
    levels = ", ".join(LEVELS)
    body.append(f'<p class="meta">Levels, lowest to highest: {esc(levels)}.</p>')
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f'<meta http-equiv="Content-Security-Policy" content="{CSP}">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>hpcsec report</title><style>{STYLE}</style></head><body>"
        + "\n".join(body)
        + "</body></html>\n"
    )

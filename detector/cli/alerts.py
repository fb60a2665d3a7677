"""`hpcsec alerts`: query the DuckDB alert store, or export its events to Parquet.

Opening the store first applies what the agent appended to its journal since the last time
(store/journal.py); `--apply` does only that, and is what the agent runs every hour.
"""

from __future__ import annotations

import argparse
import io
import sys
from collections.abc import Mapping
from typing import Any

import orjson

from hpcsec.detector.alerts.incidents import summarize_incidents
from hpcsec.detector.cli.incident_view import (
    write_incidents_json,
    write_incidents_table,
    write_timeline,
)
from hpcsec.detector.cli.render import Column, footer, write_table
from hpcsec.detector.config.site import load_config
from hpcsec.detector.core.display import visible_json
from hpcsec.detector.core.errors import UsageError
from hpcsec.detector.core.schema import LEVELS
from hpcsec.detector.store.query import AlertQuery, parse_since
from hpcsec.detector.store.rows import DISPOSITIONS

HELD = {
    "silenced": "silenced",
    "rate_limited": "rate limited",
    "below_min_level": "below --min-level",
}


def display_state(alert: Mapping[str, Any]) -> str:
    """What became of an alert, in words: `sent` only when an output accepted it; an alert
    no output was configured for, or that was held back, is `stored only`."""
    disposition = alert.get("hpcsec.disposition")
    if disposition != "sent":
        return f"stored only ({HELD.get(str(disposition), str(disposition))})"
    deliveries = alert.get("hpcsec.deliveries") or {}
    states = set(deliveries.values()) if isinstance(deliveries, Mapping) else set()
    if not states:
        return "stored only (no output)"
    if states == {"delivered"}:
        return "sent"
    others = ", ".join(sorted(str(state) for state in states - {"delivered"}))
    return f"partly sent ({others})" if "delivered" in states else f"not sent ({others})"


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "alerts",
        help="query the alert store (or export its events to Parquet)",
        description="List stored alerts, newest last. Filters combine (AND).",
    )
    p.add_argument("--store", metavar="FILE", help="DuckDB store (default: store.path of --config)")
    p.add_argument("--config", metavar="FILE", help="site config (for store.path)")
    p.add_argument(
        "--since",
        metavar="AGE|TIME",
        help="alerts seen within AGE (30m, 1h, 7d) or since an RFC 3339 time",
    )
    p.add_argument("--job", metavar="ID", help="Slurm job id")
    p.add_argument("--user", metavar="U", help="user name")
    p.add_argument(
        "--rule", metavar="ID|TEXT", help="rule id, or a part of the rule title (any case)"
    )
    p.add_argument("--host", metavar="NAME", help="node name")
    p.add_argument(
        "--level",
        choices=LEVELS,
        metavar="LEVEL",
        help=f"alerts at or above LEVEL ({', '.join(LEVELS)})",
    )
    p.add_argument("--vector", metavar="V", help="threat vector (ruleset name)")
    p.add_argument(
        "--state",
        choices=DISPOSITIONS,
        help="sent (to the outputs, if any), or only stored because silenced, rate limited "
        "or below --min-level",
    )
    p.add_argument(
        "--limit",
        type=int,
        default=1000,
        metavar="N",
        help="at most the newest N alerts (default 1000)",
    )
    view = p.add_mutually_exclusive_group()
    view.add_argument(
        "--incidents",
        action="store_true",
        help="one row per incident (alerts that belong together) instead of the alerts",
    )
    view.add_argument(
        "--incident",
        metavar="ID",
        help="the alerts of one incident, in the order they happened",
    )
    p.add_argument("--format", choices=("table", "json"), default="table")
    p.add_argument(
        "--export-events",
        metavar="FILE.parquet",
        help="write the stored events (within --since) to a Parquet file instead",
    )
    p.add_argument(
        "--apply",
        action="store_true",
        help="only apply the agent's journal to the store (and the retention), then exit",
    )
    p.add_argument(
        "--retention-days",
        type=int,
        metavar="N",
        help="keep events N days (default: store.retention_days of --config)",
    )
    p.set_defaults(func=run)


STATE = Column("state", display_state, min_width=10, max_width=24)


def render_table(alerts: list[dict[str, Any]], width: int | None = None) -> str:
    out = io.StringIO()
    write_table(alerts, out=out, width=width or None, extra=[STATE])
    return out.getvalue().rstrip("\n")


def run(args: argparse.Namespace) -> int:
    # DuckDB (with the store) is imported here, where a store is opened: `hpcsec alerts
    # --help` and a mistyped option must not pay a quarter of a second for it
    from hpcsec.detector.store.alert_store import Store

    config = load_config(args.config)
    path = args.store or config.store_path
    if not path:
        raise UsageError("no alert store: give --store FILE or store.path in --config")
    if args.limit < 1:
        raise UsageError("--limit must be at least 1")
    retention = config.retention_days if args.retention_days is None else args.retention_days
    if retention < 1:
        raise UsageError("--retention-days must be at least 1")
    since = parse_since(args.since) if args.since else None
    if args.apply:
        Store(path, retention_days=retention).close()  # opening it applies the journal
        return 0
    if args.export_events:
        with Store(path, retention_days=retention) as store:
            n = store.export_events(args.export_events, since=since)
        print(f"exported {n} event(s) to {args.export_events}", file=sys.stderr)
        return 0
    with Store(path, read_only=True, retention_days=retention) as store:
        alerts = store.query_alerts(
            AlertQuery(
                since=since,
                job=args.job,
                user=args.user,
                rule=args.rule,
                vector=args.vector,
                disposition=args.state,
                incident=args.incident,
                host=args.host,
                levels=tuple(LEVELS[LEVELS.index(args.level) :]) if args.level else None,
                limit=args.limit,
            )
        )
    if args.incidents:
        incidents = summarize_incidents(alerts)
        if args.format == "json":
            write_incidents_json(incidents)
        elif incidents:
            write_incidents_table(incidents, title=f"{len(incidents)} incident(s)")
        else:
            print("no alerts match", file=sys.stderr)
    elif args.incident and args.format == "table" and alerts:
        write_timeline(args.incident, alerts)
    elif args.format == "json":
        text = visible_json(orjson.dumps(alerts, option=orjson.OPT_INDENT_2))
        sys.stdout.write(text.decode() + "\n")
    elif alerts:
        write_table(alerts, extra=[STATE])
        print(footer(alerts))
    else:
        print("no alerts match", file=sys.stderr)
    return 0

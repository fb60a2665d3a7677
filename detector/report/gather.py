"""The alerts a report shows: from a scan of a snapshot, the demo or an events file (the
same pipeline `hpcsec scan` runs), or from the alert store."""

from __future__ import annotations

import io
from dataclasses import dataclass, field

from hpcsec.detector.alerts.model import Alert
from hpcsec.detector.config.site import load_config
from hpcsec.detector.runtime.pipeline import Pipeline
from hpcsec.detector.runtime.sources import EventSources, ScanReport, demo_snapshot_dir
from hpcsec.detector.store.alert_store import AlertQuery, Store

BATCH = 256
STORE_LIMIT = 100_000  # alerts read from a store: a report is for people, not a bulk export


@dataclass(frozen=True)
class ReportInput:
    """What the report is about: its alerts, where they came from, what the scan said."""

    alerts: list[Alert]
    source: str
    events: int | None = None
    held_back: int = 0
    notes: list[str] = field(default_factory=list)


def scan_alerts(
    *,
    config_path: str | None,
    rules: list[str] | None,
    snapshot: str | None = None,
    events_file: str | None = None,
    demo: bool = False,
) -> ReportInput:
    """Run the scan pipeline over one source and return what it decided to send."""
    if demo and not config_path:  # the demo node's own policy, as `scan --demo` uses
        config_path = str(demo_snapshot_dir() / "site-config.yml")
    config = load_config(config_path)
    pipeline = Pipeline.load(config, rules)
    report = ScanReport()
    sources = EventSources(config, report)
    if events_file:
        batches = sources.from_events_file(events_file, BATCH)
        source = f"events file {events_file}"
    else:
        batches = sources.from_snapshot(snapshot, demo=demo)
        source = "the demo snapshot" if demo else f"snapshot {snapshot}"
    for batch in batches:
        pipeline.process([batch])
    pipeline.flush()
    decision = pipeline.stage.conclude()
    text = io.StringIO()
    report.print(text)
    held = len(decision.silenced) + len(decision.rate_limited)
    return ReportInput(
        alerts=list(decision.send),
        source=source,
        events=report.events,
        held_back=held,
        notes=text.getvalue().splitlines(),
    )


def store_alerts(path: str) -> ReportInput:
    """Every stored alert (the newest STORE_LIMIT), whatever was done with it."""
    with Store(path, read_only=True) as store:
        rows = store.query_alerts(AlertQuery(limit=STORE_LIMIT))
    return ReportInput(alerts=[Alert(r) for r in rows], source=f"alert store {path}")

"""What `hpcsec scan` does with its decided alerts: outputs, then the store.

Silenced and rate-limited alerts are not sent (a summary alert says how many were held back);
with `--store` they are kept there with their disposition. Outputs go through the durable
spool: leftovers of an earlier run are sent first, and what cannot be delivered before the
scan exits stays in the spool for the next scan or the agent.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

from hpcsec.detector.alerts.model import Alert
from hpcsec.detector.alerts.suppression import Decision
from hpcsec.detector.core.display import visible
from hpcsec.detector.runtime.endpoints import DeliveryReport, OutputSet

if TYPE_CHECKING:  # duckdb is imported only by commands that open a store (start-up time)
    from hpcsec.detector.store.alert_store import Store


def report_held(decision: Decision) -> None:
    """One stderr line when silences or rate limits held alerts back."""
    if decision.silenced or decision.rate_limited:
        print(
            f"hpcsec: {len(decision.silenced)} alert(s) silenced, "
            f"{len(decision.rate_limited)} rate-limited (not sent)",
            file=sys.stderr,
        )


def deliver_alerts(outputs: OutputSet, alerts: list[Alert]) -> DeliveryReport:
    """Send leftovers of earlier runs, then `alerts`; what happened goes to stderr."""
    leftovers = outputs.flush()
    if leftovers.outcomes:
        delivered = sum(1 for o in leftovers.outcomes if o.state == "delivered")
        print(
            f"hpcsec: delivered {delivered} alert(s) left in the spool by an earlier run",
            file=sys.stderr,
        )
    report = outputs.deliver(alerts)
    report.outcomes[:0] = leftovers.outcomes  # so the store learns they were delivered
    for name, dest in report.destinations.items():
        if dest.delivered:
            print(f"hpcsec: sent {dest.delivered} alert(s) to {visible(name)}", file=sys.stderr)
    for line in report.problems():  # receivers' replies are in there: shown, not obeyed
        print(f"hpcsec: {visible(line)}", file=sys.stderr)
    return report


def store_decision(store: Store, decision: Decision, report: DeliveryReport | None) -> None:
    """Every alert with its disposition; with outputs, the spool's notices and deliveries."""
    store.insert_decision(decision)
    if report is not None:
        store.insert_alerts(report.notices)
        store.record_deliveries(report.outcomes)

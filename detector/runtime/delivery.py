"""What `hpcsec scan` does with its alerts: silences and rate limits, then outputs.

Silenced and rate-limited alerts are not sent (a summary alert says how many were held back);
with `--store` they are kept there with their disposition. Outputs go through the durable
spool: leftovers of an earlier run are sent first, and what cannot be delivered before the
scan exits stays in the spool for the next scan or the agent.
"""

from __future__ import annotations

import sys
from typing import Any

from hpcsec.detector.alerts.suppression import Decision, Suppressor
from hpcsec.detector.config.site import SiteConfig
from hpcsec.detector.outputs.delivery import DeliveryReport, OutputSet
from hpcsec.detector.outputs.registry import open_outputs

Alert = dict[str, Any]


def suppress(alerts: list[Alert], config: SiteConfig) -> Decision:
    suppressor = Suppressor.from_config(config)
    decision = suppressor.apply(alerts)
    decision.send.extend(suppressor.finish())
    held = len(decision.silenced) + len(decision.rate_limited)
    if held:
        print(
            f"hpcsec: {len(decision.silenced)} alert(s) silenced, "
            f"{len(decision.rate_limited)} rate-limited (not sent)",
            file=sys.stderr,
        )
    return decision


def open_store(store_path: str | None, config: SiteConfig) -> Any:
    if not store_path:
        return None
    from hpcsec.detector.store.alert_store import Store

    return Store(store_path, retention_days=config.retention_days)


def store_decision(store: Any, decision: Decision, report: Any = None) -> None:
    if store is None:
        return
    store.insert_decision(decision)
    if report is not None:
        store.insert_alerts(report.notices)
        store.record_deliveries(report.outcomes)


def open_scan_outputs(urls: list[str], args: Any, config: SiteConfig) -> OutputSet | None:
    """The outputs, opened before the scan runs so a bad URL or secret fails at once."""
    if not urls:
        return None
    return open_outputs(
        urls, secret_file=args.webhook_secret_file, spool_dir=args.spool, config=config
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
            print(f"hpcsec: sent {dest.delivered} alert(s) to {name}", file=sys.stderr)
    for line in report.problems():
        print(f"hpcsec: {line}", file=sys.stderr)
    return report

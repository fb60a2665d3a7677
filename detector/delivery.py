"""What `hpcsec scan` does with its alerts: silences and rate limits, then outputs.

Silenced and rate-limited alerts are not sent (a summary alert says how many were held back);
with `--store` they are kept there with their disposition. Outputs go through the durable
spool: leftovers of an earlier run are sent first, and what cannot be delivered before the
scan exits stays in the spool for the next scan or the agent.
"""

from __future__ import annotations

import sys
from typing import Any

from .config import SiteConfig
from .outputs.base import DeliveryReport, open_outputs
from .suppression import Decision, Suppressor

Alert = dict[str, Any]


def suppress(alerts: list[Alert], config: SiteConfig) -> Decision:
    suppressor = Suppressor.from_config(config)
    decision = suppressor.apply(alerts)
    decision.send.extend(suppressor.finish())
    held = len(decision.silenced) + len(decision.rate_limited)
    if held:
        print(f"hpcsec: {len(decision.silenced)} alert(s) silenced, "
              f"{len(decision.rate_limited)} rate-limited (not sent)", file=sys.stderr)
    return decision


def store_decision(store_path: str | None, config: SiteConfig, decision: Decision,
                   report: Any = None) -> None:
    if not store_path:
        return
    from .store import Store

    store = Store(store_path, retention_days=config.retention_days)
    store.insert_decision(decision)
    if report is not None:
        store.insert_alerts(report.notices)
        store.record_deliveries(report.outcomes)


def deliver_alerts(alerts: list[Alert], urls: list[str], args: Any,
                   config: SiteConfig) -> DeliveryReport:
    """Send through the outputs; problems (spooled, refused, dropped) go to stderr."""
    with open_outputs(urls, secret_file=args.webhook_secret_file, spool_dir=args.spool,
                      config=config) as outputs:
        leftovers = outputs.flush()
        if leftovers.outcomes:
            delivered = sum(1 for o in leftovers.outcomes if o.state == "delivered")
            print(f"hpcsec: delivered {delivered} alert(s) left in the spool by an earlier run",
                  file=sys.stderr)
        report = outputs.deliver(alerts)
        for line in report.problems():
            print(f"hpcsec: {line}", file=sys.stderr)
        return report

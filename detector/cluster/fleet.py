"""Firmware versions across the fleet, as the hub sees them arrive.

A node class is the hardware the component sits on, read from the event itself (events of
one host reach the hub through different partitions, in no fixed order): the system product
or board name (DMI), else the board id (an HCA's PSID), else "unknown". Per (class, component)
each host votes with its latest version; a version held by more than half of at least
MIN_HOSTS hosts is the majority (`hpcsec.cluster.firmware_majority_version`).

Events arrive in any order: the odd node may report before the fleet does. So when the
majority forms or changes, the latest events of the hosts that now differ from it are handed
back to be evaluated again (same event, same time: an alert raised for it keeps its id).
"""

from __future__ import annotations

from collections import Counter
from typing import Any

Event = dict[str, Any]
MIN_HOSTS = 3
UNKNOWN_CLASS = "unknown"
MAX_HOSTS_PER_CLASS = 100_000  # bounds the memory a flood of invented host names can take


def node_class_of(event: Event) -> str:
    for field in ("firmware.product_name", "firmware.board_name", "firmware.board_id"):
        value = event.get(field)
        if isinstance(value, str) and value:
            return value[:128]
    return UNKNOWN_CLASS


class FleetFirmware:
    def __init__(self, min_hosts: int = MIN_HOSTS):
        self.min_hosts = min_hosts
        self.latest: dict[tuple[str, str], dict[str, Event]] = {}

    def majority(self, hosts: dict[str, Event]) -> str | None:
        if len(hosts) < self.min_hosts:
            return None
        votes = Counter(str(e.get("firmware.version")) for e in hosts.values())
        version, count = max(votes.items(), key=lambda item: (item[1], item[0]))
        return version if count * 2 > len(hosts) else None

    def observe(self, event: Event) -> list[Event]:
        """Events to evaluate for one firmware event: it (annotated when a majority exists),
        plus earlier hosts of its class that differ from a majority that just formed."""
        host, component = event.get("host.name"), event.get("firmware.component")
        if not isinstance(host, str) or not isinstance(component, str):
            return [event]
        if event.get("firmware.version") is None:
            return [event]
        node_class = node_class_of(event)
        hosts = self.latest.setdefault((node_class, component), {})
        before = self.majority(hosts)
        if host in hosts or len(hosts) < MAX_HOSTS_PER_CLASS:
            hosts[host] = event
        after = self.majority(hosts)
        out = [self._annotated(event, node_class, after, len(hosts))]
        if after is not None and after != before:
            out += [
                self._annotated(dict(e), node_class, after, len(hosts))
                for h, e in hosts.items()
                if h != host and str(e.get("firmware.version")) != after
            ]
        return out

    @staticmethod
    def _annotated(event: Event, node_class: str, majority: str | None, hosts: int) -> Event:
        event["hpcsec.cluster.node_class"] = node_class
        event["hpcsec.cluster.class_hosts"] = hosts
        if majority is not None:
            event["hpcsec.cluster.firmware_majority_version"] = majority
        else:
            event.pop("hpcsec.cluster.firmware_majority_version", None)
        return event

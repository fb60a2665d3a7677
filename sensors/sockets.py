"""TCP/UDP sockets with their owning process — category `network_socket`.

The kernel's sock_diag netlink family (through pyroute2) lists IPv4 and IPv6 sockets with
their inode; the owner is found by reading the `socket:[inode]` links under
/proc/<pid>/fd. The listing is kept as the `sockets.json` raw input so a snapshot replays
through the same code.
"""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from typing import Any

from hpcsec.detector.core.schema import Event, new_event
from hpcsec.sensors.base import SensorContext, SensorUnavailable
from hpcsec.sensors.procinfo import Users, process_fields

# include/net/tcp_states.h
TCP_STATES = {
    1: "ESTABLISHED",
    2: "SYN_SENT",
    3: "SYN_RECV",
    4: "FIN_WAIT1",
    5: "FIN_WAIT2",
    6: "TIME_WAIT",
    7: "CLOSE",
    8: "CLOSE_WAIT",
    9: "LAST_ACK",
    10: "LISTEN",
    11: "CLOSING",
    12: "NEW_SYN_RECV",
}
# What `ss` calls an unconnected UDP socket (TCP_CLOSE in the kernel): it receives, like LISTEN.
UDP_UNCONNECTED = "UNCONN"
# sock_diag state filters (bit n = state n): what a rule can act on, not TIME_WAIT debris.
TCP_WANTED = (1 << 1) | (1 << 10)  # ESTABLISHED, LISTEN
UDP_WANTED = (1 << 1) | (1 << 7)  # connected, unconnected (bound)


def _state_name(transport: str, code: int) -> str:
    if transport == "udp" and code == 7:
        return UDP_UNCONNECTED
    return TCP_STATES.get(code, str(code))


def socket_owners(ctx: SensorContext, inodes: set[int]) -> dict[int, int]:
    """socket inode -> pid of the first process holding it (lowest pid)."""
    owners: dict[int, int] = {}
    if not inodes:
        return owners
    for name in ctx.proc.listdir():
        if not name.isdigit():
            continue
        for fd in ctx.proc.listdir(f"{name}/fd"):
            target = ctx.proc.readlink(f"{name}/fd/{fd}")
            if target and target.startswith("socket:["):
                inode = int(target[8:-1]) if target[8:-1].isdigit() else -1
                if inode in inodes:
                    owners.setdefault(inode, int(name))
    return owners


def live_sockets() -> list[dict[str, Any]]:
    """Listening and established TCP, bound and connected UDP, v4 and v6 (no owners yet)."""
    from pyroute2 import DiagSocket

    out: list[dict[str, Any]] = []
    with DiagSocket() as diag:
        diag.bind()
        for family in (socket.AF_INET, socket.AF_INET6):
            for transport, proto, states in (
                ("tcp", socket.IPPROTO_TCP, TCP_WANTED),
                ("udp", socket.IPPROTO_UDP, UDP_WANTED),
            ):
                for msg in diag.get_sock_stats(family=family, protocol=proto, states=states):
                    out.append(
                        {
                            "transport": transport,
                            "state": _state_name(transport, msg["idiag_state"]),
                            "source.ip": msg["idiag_src"],
                            "source.port": msg["idiag_sport"],
                            "destination.ip": msg["idiag_dst"],
                            "destination.port": msg["idiag_dport"],
                            "inode": msg["idiag_inode"],
                        }
                    )
    return out


def parse_sockets(text: str) -> tuple[list[dict[str, Any]], int]:
    """`sockets.json` -> (records, malformed count). Raises ValueError if not a JSON list."""
    data = json.loads(text)
    if not isinstance(data, list):
        raise ValueError("sockets.json: expected a JSON list")
    good, bad = [], 0
    for item in data:
        if (
            isinstance(item, dict)
            and item.get("transport") in ("tcp", "udp")
            and isinstance(item.get("source.port"), int)
            and isinstance(item.get("inode"), int)
        ):
            good.append(item)
        else:
            bad += 1
    return good, bad


class SocketSensor:
    name = "sockets"

    def collect(self, ctx: SensorContext) -> Iterator[Event]:
        text = ctx.raw_input("sockets.json", lambda: self._live_json(ctx))
        if text is None:
            raise SensorUnavailable("no socket listing (sockets.json) in this sample")
        try:
            records, malformed = parse_sockets(text)
        except ValueError as exc:
            yield ctx.status(self.name, "malformed", f"sockets.json: {exc}")
            return
        if malformed:
            yield ctx.status(
                self.name,
                "malformed",
                f"{malformed} malformed socket records",
                **{"hpcsec.malformed": malformed},
            )
        users = Users.load(ctx.etc)
        process_cache: dict[int, dict[str, Any]] = {}
        for rec in records:
            fields: dict[str, Any] = {
                "network.transport": rec["transport"],
                "network.state": rec.get("state"),
                "network.inode": rec["inode"],
                "source.ip": rec.get("source.ip"),
                "source.port": rec["source.port"],
                "destination.ip": rec.get("destination.ip"),
                "destination.port": rec.get("destination.port"),
            }
            pid = rec.get("pid")
            if isinstance(pid, int):
                if pid not in process_cache:
                    process_cache[pid] = process_fields(ctx, pid, users)
                fields.update(process_cache[pid] or {"process.pid": pid})
            yield new_event(
                "network_socket", "present", self.name, ctx.host_name, ctx.timestamp, fields
            )

    def _live_json(self, ctx: SensorContext) -> str:
        try:
            records = live_sockets()
        except (ImportError, OSError) as exc:
            raise SensorUnavailable(f"sock_diag netlink: {exc}") from None
        owners = socket_owners(ctx, {r["inode"] for r in records if r["inode"]})
        for rec in records:
            rec["pid"] = owners.get(rec["inode"])
        records.sort(key=lambda r: (r["transport"], r["source.port"], r["inode"]))
        return json.dumps(records, indent=1) + "\n"

"""TCP/UDP sockets with their owning process — category `network_socket`.

The kernel's sock_diag netlink family (through pyroute2) lists IPv4 and IPv6 sockets with
their inode; the owner is found by reading the `socket:[inode]` links under
/proc/<pid>/fd. The listing is kept as the `sockets.json` raw input so a snapshot replays
through the same code.

Reading every descriptor link of every process each sample costs what users hold (200,000
descriptors of one user: about 1.4 s of CPU per sample), so `SocketOwners` keeps each
process's socket inodes across samples, keyed by pid and start time, and reads a process's
links again only when its descriptor count changed. A descriptor swapped for a socket without
changing the count is found by a walk of every process, made when a socket has no known owner,
at most once every FULL_WALK_EVERY samples (docs/agent.md, "Sampling cost").
"""

from __future__ import annotations

import json
import os
import socket
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from hpcsec.detector.core.schema import Event, new_event
from hpcsec.sensors.base import FsRoot, SensorContext, SensorUnavailable
from hpcsec.sensors.procinfo import Users, process_fields, start_time

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


# The owner cache's bound: past this many processes it is forgotten, not hoarded (a fork
# storm costs one full walk, not memory).
MAX_CACHED_PROCESSES = 65536
# A socket without a known owner makes every process walked again at most this often
# (samples): the cost of a full walk, spread out, and the longest a descriptor swapped for a
# socket (same count) stays unattributed. A socket no process holds (in flight between
# processes) keeps costing that walk every FULL_WALK_EVERY samples: it is not exempted, or
# handing it over later in a swapped descriptor would hide its owner for good.
FULL_WALK_EVERY = 6


def socket_inodes(proc: FsRoot, pid: int) -> frozenset[int]:
    """Inodes of the sockets `pid` holds: one readlink per descriptor."""
    found: set[int] = set()
    for fd in proc.listdir(f"{pid}/fd"):
        target = proc.readlink(f"{pid}/fd/{fd}")
        if target and target.startswith("socket:[") and target[8:-1].isdigit():
            found.add(int(target[8:-1]))
    return frozenset(found)


def fd_count(proc: FsRoot, pid: int) -> int | None:
    """How many descriptors `pid` holds: the size Linux (6.2 and later) gives /proc/<pid>/fd,
    without listing it; older kernels say 0, and then the entries are counted."""
    path = proc.full_path(f"{pid}/fd")
    try:
        size = os.stat(path).st_size
        return size if size > 0 else len(os.listdir(path))
    except OSError:
        return None


@dataclass(frozen=True)
class _Walked:
    start: int  # /proc/<pid>/stat start time: a reused pid is another process
    fds: int  # descriptors counted before the walk
    inodes: frozenset[int]


class SocketOwners:
    """socket inode -> owning pid, kept from one sample to the next (see the module doc)."""

    def __init__(self) -> None:
        self._walked: dict[int, _Walked] = {}
        self._since_full_walk = 0
        self.walks = 0  # processes whose links were read, since creation

    def owners(self, proc: FsRoot, wanted: set[int]) -> dict[int, int]:
        if not wanted:
            return {}
        pids = sorted(int(name) for name in proc.listdir() if name.isdigit())
        kept: dict[int, _Walked] = {}
        walked_now: set[int] = set()
        for pid in pids:
            entry = self._current(proc, pid, walked_now)
            if entry is not None:
                kept[pid] = entry
        self._since_full_walk = 0 if len(walked_now) == len(kept) else self._since_full_walk + 1
        owners = _first_owners(kept, wanted)
        if wanted - owners.keys() and self._since_full_walk >= FULL_WALK_EVERY:
            for pid, entry in kept.items():  # a descriptor swapped without a count change
                if pid not in walked_now:
                    kept[pid] = self._walk(proc, pid, entry.start, entry.fds)
            self._since_full_walk = 0
            owners = _first_owners(kept, wanted)
        self._walked = kept if len(kept) <= MAX_CACHED_PROCESSES else {}
        return owners

    def _current(self, proc: FsRoot, pid: int, walked_now: set[int]) -> _Walked | None:
        start = start_time(proc, pid)
        count = fd_count(proc, pid)
        if start is None or count is None:
            return None  # gone, or its descriptors are not ours to read
        cached = self._walked.get(pid)
        if cached is not None and cached.start == start and cached.fds == count:
            return cached
        walked_now.add(pid)
        return self._walk(proc, pid, start, count)

    def _walk(self, proc: FsRoot, pid: int, start: int, count: int) -> _Walked:
        # the count was read before the links: a change during the walk shows next sample
        self.walks += 1
        return _Walked(start, count, socket_inodes(proc, pid))


def _first_owners(walked: dict[int, _Walked], wanted: set[int]) -> dict[int, int]:
    owners: dict[int, int] = {}
    for pid, entry in walked.items():  # in pid order
        for inode in entry.inodes & wanted:
            owners.setdefault(inode, pid)
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

    def __init__(self) -> None:
        self.owners = SocketOwners()  # lives as long as the sensor: across samples

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
        owners = self.owners.owners(ctx.proc, {r["inode"] for r in records if r["inode"]})
        for rec in records:
            rec["pid"] = owners.get(rec["inode"])
        records.sort(key=lambda r: (r["transport"], r["source.port"], r["inode"]))
        return json.dumps(records, indent=1) + "\n"

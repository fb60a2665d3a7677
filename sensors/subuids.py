"""Who answers for a uid: the user itself, or, for a subordinate uid, the user it belongs to.

A user allowed rootless containers (podman, Apptainer --fakeroot) owns a range of
subordinate uids, listed in the node's `etc/subuid` (`name-or-uid:first:count`,
shadow-utils): root in the user's namespace is that user, and can chown files and run
processes as any of the 65,536 host uids of the range. A bound per uid
(file_access/shares.py, stalls.py) would give that user 65,536 shares; per owner, the whole
range is one.

Read through the context's etc root (`--etc-root`, and snapshots), and names resolved
through its `passwd` only, never NSS (a directory service that does not answer must not
hold the agent): a range whose name is not there stands for one owner of its own, told apart
from its user's own uid, so the user gets two shares, not 65,536. Where ranges overlap,
the one that starts first keeps what they share. Ranges a directory service hands out (the
subid NSS plugin) are not seen. On a node whose ranges cover real users' uids (a
misconfiguration: such a container acts as those users on shared file systems), those
users' files count for the range's owner too; a process counts for the range's owner only
when it runs in a user namespace other than init's (procinfo.owner_key).
"""

from __future__ import annotations

import bisect
import threading
import time
from collections.abc import Callable

from hpcsec.sensors.base import FsRoot

RELOAD_S = 60.0  # the files are looked at again (their size and mtime) at most this often
MAX_BYTES = 1 << 20  # files read at most this far (whole lines)


class Subordinates:
    """Subordinate uid ranges, each with the owner key it counts for."""

    def __init__(self, ranges: list[tuple[int, int, int]]):
        self.ranges = ranges  # (first, last + 1, owner key), sorted and disjoint
        self.firsts = [first for first, _, _ in ranges]

    @classmethod
    def parse(cls, subuid: str, passwd: str) -> Subordinates:
        uids: dict[str, int] = {}
        for line in passwd.split("\n"):
            parts = line.split(":")
            if len(parts) >= 3 and parts[0] and _number(parts[2]) is not None:
                uids.setdefault(parts[0], int(parts[2]))
        listed: list[tuple[int, int, int]] = []
        unnamed = 0
        for line in subuid.split("\n"):
            parts = line.strip().split(":")
            if len(parts) != 3:
                continue
            first, count = _number(parts[1]), _number(parts[2])
            if first is None or not count:
                continue
            owner = _number(parts[0])
            if owner is None:
                owner = uids.get(parts[0])
            if owner is None:  # a name not in passwd: the range is an owner of its own
                unnamed += 1
                owner = -unnamed
            listed.append((first, first + count, owner))
        # disjoint: the range that starts first keeps what two ranges share
        ranges: list[tuple[int, int, int]] = []
        covered = 0  # uids below it belong to a range already
        for first, end, owner in sorted(listed):
            start = max(first, covered)
            if start < end:
                ranges.append((start, end, owner))
                covered = end
        return cls(ranges)

    def owner(self, uid: int) -> int:
        """The owner key of `uid`: itself, or the user of the range it falls in."""
        at = bisect.bisect_right(self.firsts, uid) - 1
        if at >= 0:
            first, end, owner = self.ranges[at]
            if first <= uid < end:
                return owner
        return uid


def _number(text: str) -> int | None:
    return int(text) if text.isascii() and text.isdigit() else None


NONE = Subordinates([])
_lock = threading.Lock()
# etc root -> (when looked at, what the files were, their ranges)
_loaded: dict[str, tuple[float, tuple[object, ...], Subordinates]] = {}


def current(etc: FsRoot) -> Subordinates:
    """The subordinate ranges of the node behind `etc`, read again when `subuid` or `passwd`
    changes (looked at every RELOAD_S at most)."""
    key = str(etc.path)
    with _lock:
        now = time.monotonic()
        loaded = _loaded.get(key)
        if loaded is not None and now - loaded[0] < RELOAD_S:
            return loaded[2]
        seen = tuple(_identity(etc, name) for name in ("subuid", "passwd"))
        if loaded is not None and loaded[1] == seen:
            subordinates = loaded[2]
        elif seen[0] is None:  # no subuid file: no ranges
            subordinates = NONE
        else:
            subordinates = Subordinates.parse(
                _whole_lines(etc, "subuid"), _whole_lines(etc, "passwd")
            )
        if len(_loaded) > 8:  # a handful of roots at most (tests, replays)
            _loaded.clear()
        _loaded[key] = (now, seen, subordinates)
        return subordinates


def owners(etc: FsRoot) -> Callable[[int], int]:
    """A uid's owner on the node behind `etc`, as the ranges are when it is asked."""
    return lambda uid: current(etc).owner(uid)


def _identity(etc: FsRoot, name: str) -> tuple[int, int, int] | None:
    try:
        info = (etc.path / name).stat()
    except OSError:
        return None
    return info.st_ino, info.st_size, info.st_mtime_ns


def _whole_lines(etc: FsRoot, name: str) -> str:
    data = etc.read_bytes(name, MAX_BYTES) or b""
    if len(data) >= MAX_BYTES:  # cut: its last line may be part of one
        data = data[: data.rfind(b"\n") + 1]
    return data.decode("utf-8", "replace")


def forget() -> None:
    """Read the files again at the next look (tests)."""
    with _lock:
        _loaded.clear()

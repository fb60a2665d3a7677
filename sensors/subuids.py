"""Who answers for a uid: the user itself, or, for a subordinate uid, the user it belongs to.

A user allowed rootless containers (podman, Apptainer --fakeroot) owns a range of
subordinate uids, listed in /etc/subuid (`name-or-uid:first:count`, shadow-utils): root in
the user's namespace is that user, and can chown files and run processes as any of the
65,536 host uids of the range. A bound per uid (file_access/shares.py, stalls.py) would give
that user 65,536 shares; per owner, the whole range is one.

Names are resolved through the node's /etc/passwd only, never NSS (a directory service that
does not answer must not hold the agent): a range whose name is not there stands for one
owner of its own, told apart from its user's own uid, so the user gets two shares, not
65,536. Ranges a directory service hands out (the subid NSS plugin) are not seen.
"""

from __future__ import annotations

import bisect
import os
import threading
import time

SUBUID_PATH = "/etc/subuid"
PASSWD_PATH = "/etc/passwd"
RELOAD_S = 60.0  # the files are looked at again (their mtime) at most this often
MAX_BYTES = 4 * 2**20  # files read at most this far


class Subordinates:
    """Subordinate uid ranges, each with the owner key it counts for."""

    def __init__(self, ranges: list[tuple[int, int, int]]):
        self.ranges = sorted(ranges)  # (first, last + 1, owner key)
        self.firsts = [first for first, _, _ in self.ranges]

    @classmethod
    def parse(cls, subuid: str, passwd: str) -> Subordinates:
        uids: dict[str, int] = {}
        for line in passwd.split("\n"):
            parts = line.split(":")
            if len(parts) >= 3 and parts[0] and parts[2].isdigit():
                uids.setdefault(parts[0], int(parts[2]))
        ranges: list[tuple[int, int, int]] = []
        unnamed = 0
        for line in subuid.split("\n"):
            parts = line.strip().split(":")
            if len(parts) != 3 or not parts[1].isdigit() or not parts[2].isdigit():
                continue
            first, count = int(parts[1]), int(parts[2])
            if count <= 0:
                continue
            owner = int(parts[0]) if parts[0].isdigit() else uids.get(parts[0])
            if owner is None:  # a name not in passwd: the range is an owner of its own
                unnamed += 1
                owner = -unnamed
            ranges.append((first, first + count, owner))
        return cls(ranges)

    def owner(self, uid: int) -> int:
        """The owner key of `uid`: itself, or the user of the range it falls in."""
        at = bisect.bisect_right(self.firsts, uid) - 1
        if at >= 0:
            first, end, owner = self.ranges[at]
            if first <= uid < end:
                return owner
        return uid


_lock = threading.Lock()
_loaded: tuple[float, tuple[int, int], Subordinates] | None = None  # when, mtimes, ranges


def _mtime(path: str) -> int:
    try:
        return os.stat(path).st_mtime_ns
    except OSError:
        return 0


def _read(path: str) -> str:
    try:
        with open(path, "rb") as f:
            return f.read(MAX_BYTES).decode("utf-8", "replace")
    except OSError:
        return ""


def owner_of(uid: int | None) -> int | None:
    """The owner key of a uid on this node (None stays None): its /etc/subuid ranges, read
    again when the file changes (looked at every RELOAD_S at most)."""
    if uid is None:
        return None
    return current().owner(uid)


def current() -> Subordinates:
    global _loaded
    with _lock:
        now = time.monotonic()
        if _loaded is not None and now - _loaded[0] < RELOAD_S:
            return _loaded[2]
        mtimes = (_mtime(SUBUID_PATH), _mtime(PASSWD_PATH))
        if _loaded is not None and _loaded[1] == mtimes:
            subordinates = _loaded[2]
        else:
            subordinates = Subordinates.parse(_read(SUBUID_PATH), _read(PASSWD_PATH))
        _loaded = (now, mtimes, subordinates)
        return subordinates


def forget() -> None:
    """Read the files again at the next look (tests, and a path changed)."""
    global _loaded
    with _lock:
        _loaded = None

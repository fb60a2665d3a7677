"""Directories that appear in a protected tree while the watch runs, walked for what they
already hold, on a thread of their own.

A create reaches only the mark of the directory it is made in, and the watch marks a new
directory some milliseconds after its create event. What is made in it before that has no
event of its own: `mkdir -p a/b/c` and an untar make b, c and their files first, and a tree
moved in from elsewhere (a checkpoint written to scratch, then moved into place) arrives
whole in one rename. Unwalked, all of it stays unwatched until the next start: the model
weights written there later are read unseen.

So each new directory (fanwatch.py marks it first, within its owner's share) is queued here,
and this module's thread walks it: each directory under it is marked before it is listed,
so what is made in it afterwards has its create event, and what was made before is in the
listing. The reader thread that answers opens never walks.

The walk is where an unprivileged user has the most say, so:
- the new directory is opened with O_NOFOLLOW and its path read back from the descriptor;
  every directory is queued and opened by its file handle, so it is the inode charged that
  is walked, wherever it is by then (a checkpoint saved to `ck.tmp` and renamed `ck` before
  its walk is still walked), and only while its path, read back, is in a watched tree; it
  is listed and its entries stat'ed through its descriptor, and the marks travel to the
  responder as that descriptor: a symlink in the tree is not followed, and one swapped in
  for a directory gets nothing outside the tree marked or indexed;
- directories are charged to their owners' shares (shares.py), past which they are neither
  marked nor walked, and counted; a directory already charged (moved out and in again, or
  seen by both threads) is not charged twice, and one swapped in for a directory charged
  is charged on its own;
- the queue is bounded in all and per owner (MAX_PENDING, MAX_PENDING_PER_OWNER): a user who
  makes directories in a loop fills her own part of it, not the part that walks everyone
  else's; what finds no room is counted as unwatched. A directory moved in again before its
  walk began is walked once;
- owners take turns, a slice of SLICE_ENTRIES entries each, and the walker walks at most
  RATE_PER_S entries a second after a burst of BURST: moving a huge tree out and in again in
  a loop costs the node a bounded share of one core, and delays another user's walk by a
  slice, not by the whole tree.
"""

from __future__ import annotations

import contextlib
import os
import stat
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import NamedTuple

from hpcsec.sensors.file_access import fanotify as fan
from hpcsec.sensors.file_access.shares import identity_of

# Walks waiting, at most: in all, and of one owner.
MAX_PENDING = 4096
MAX_PENDING_PER_OWNER = 256
# A walk goes on in slices of this many entries (a directory opened counts as one), owners
# taking turns: a user's huge tree delays another's checkpoint by one slice, not one walk.
SLICE_ENTRIES = 1024
# Entries walked per second in all, after a burst: moving a tree out and in again costs a
# user one `mv` and the walker the whole tree, so the walker's CPU is bounded here, not by
# what users do. An entry costs the agent about 46 us (stat, shares, the mark's frame, the
# index: a 60,000-file tree moved in, measured), so at most about a tenth of one core; a
# checkpoint of up to BURST entries is walked at once.
RATE_PER_S = 2_000
BURST = 100_000
_OPEN_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_STOP_WAIT_S = 5.0


def open_checked(path: str) -> int | None:
    """A descriptor on the directory `path` (absolute, as the OS takes it), or None when
    `path` does not name a directory now: it is gone, a symlink, or reached through one
    (O_NOFOLLOW refuses the last name, and the path read back from the descriptor differs)."""
    try:
        fd = os.open(path, _OPEN_DIR)
    except OSError:
        return None
    try:
        # our own descriptor table: the literal /proc of the agent's namespace
        if os.readlink(f"/proc/self/fd/{fd}") == path:
            return fd
    except OSError:
        pass
    os.close(fd)
    return None


class Pending(NamedTuple):
    """A directory to walk: its handle (it is opened by it, wherever it is by then), the
    identity charged for it, and whether it is marked already (a walk's top is, by the
    reader)."""

    handle: fan.Handle
    identity: int
    marked: bool


@dataclass(frozen=True)
class Visitor:
    """What the watch does with what a walk meets."""

    # a subdirectory (its parent's path, its entry): the identity charged, None if refused
    descend: Callable[[str, os.DirEntry[str]], int | None]
    # a directory opened that is not the inode charged (swapped in since): charge it, or not
    admit: Callable[[str, os.stat_result], bool]
    in_tree: Callable[[str], bool]  # a path read back from a descriptor, in a watched tree
    on_dir: Callable[[str, int], None]  # a directory to mark (its path, its descriptor)
    on_file: Callable[[str, os.DirEntry[str], int], None]  # an entry, its directory's fd
    unwalked: Callable[[str, str], None]  # a directory left unwalked, and why


class _Listing:
    """A directory being listed, through its descriptor: a walk's slice may end within it."""

    def __init__(self, path: str, fd: int, dev: int):
        self.path = path
        self.fd = fd
        self.dev = dev  # its filesystem: a subdirectory on another is a mount point
        self.entries = os.scandir(fd)
        self.subdirs: list[Pending] = []

    def close(self) -> None:
        self.entries.close()
        os.close(self.fd)


@dataclass
class TreeWalk:
    """One new directory's walk, as far as it got: the directories still to list, and the
    one being listed. `mount_fd`: a descriptor on its filesystem (the watch's, kept open while
    the walker runs), to open handles through; a directory on another filesystem (a mount in
    the tree) is not walked. `arrival`: the pid and time of the move that brought the tree
    in (None: made in the tree), whose files the watch reports as moved in."""

    top: str
    owner: int
    mount_fd: int
    handle: fan.Handle
    identity: int
    arrival: tuple[int, str] | None = None
    stack: list[Pending] = field(default_factory=list)
    listing: _Listing | None = None

    def __post_init__(self) -> None:
        if not self.stack:
            self.stack.append(Pending(self.handle, self.identity, True))

    @property
    def over(self) -> bool:
        return not self.stack and self.listing is None

    @property
    def key(self) -> tuple[int, fan.Handle]:
        """The directory walked: its filesystem (st_dev) and its handle."""
        return self.identity >> 64, self.handle

    def close(self) -> None:
        """Give the walk up (its descriptor closed)."""
        self.stack.clear()
        if self.listing is not None:
            self.listing.close()
            self.listing = None


def walk_slice(walk: TreeWalk, entries: int, visitor: Visitor) -> int:
    """Walk on for `entries` entries (a directory opened is one, each entry listed one).
    Each directory is opened by its handle (a rename or a symlink swapped in since it was
    listed changes nothing: it is the inode charged that is opened, wherever it is now),
    walked only while its path, read back from the descriptor, is in a watched tree, handed
    to `visitor.on_dir` before it is listed, then listed through its descriptor; each entry
    that is not a directory goes to `visitor.on_file`, each subdirectory on the same
    filesystem that `visitor.descend` takes is queued by its handle. Symlinks are entries,
    never followed. Depth first, one directory open at a time; a slice may end within a
    directory (the next goes on there). Returns the entries used; `walk.over` says when it
    is done."""
    used = 0
    while used < entries:
        if walk.listing is None:
            if not walk.stack:
                break
            used += 1
            opened = _open_pending(walk, walk.stack.pop(), visitor)
            if opened is None:
                continue
            fd, path, marked, dev = opened
            try:
                if not marked:
                    visitor.on_dir(path, fd)
                walk.listing = _Listing(path, fd, dev)
            except OSError:
                os.close(fd)
                continue
            except BaseException:
                os.close(fd)
                raise
        listing = walk.listing
        done = True
        try:
            for entry in listing.entries:
                used += 1
                _visit(listing, entry, visitor)
                if used >= entries:
                    done = False
                    break
        except OSError:  # gone while listed: what was listed is still walked
            pass
        if done:
            walk.stack.extend(reversed(listing.subdirs))
            walk.listing = None
            listing.close()
    return used


def _visit(listing: _Listing, entry: os.DirEntry[str], visitor: Visitor) -> None:
    try:
        is_dir = entry.is_dir(follow_symlinks=False)
    except OSError:
        return
    child = os.path.join(listing.path, entry.name)
    if not is_dir:
        visitor.on_file(child, entry, listing.fd)
        return
    # not across a mount point (or into a btrfs subvolume): a handle of the filesystem there
    # would be read as one of this filesystem's
    try:
        crossing = entry.stat(follow_symlinks=False).st_dev != listing.dev
    except OSError:
        return
    if crossing:
        visitor.unwalked(child, "a mount point, not walked (watched from the next start)")
        return
    identity = visitor.descend(listing.path, entry)
    if identity is not None:
        handle = fan.handle_at(listing.fd, entry.name)
        if handle is not None:
            listing.subdirs.append(Pending(handle, identity, False))


def _open_pending(
    walk: TreeWalk, pending: Pending, visitor: Visitor
) -> tuple[int, str, bool, int] | None:
    """The directory a pending entry names, open, its path, whether it is marked and its
    st_dev; None
    when it is gone, out of the watched trees, or an inode other than the one charged that
    the shares refuse."""
    try:
        fd = fan.open_handle(walk.mount_fd, pending.handle, _OPEN_DIR)
    except OSError:
        return None
    try:
        path = os.readlink(f"/proc/self/fd/{fd}")  # our own descriptor table
        info = os.fstat(fd)
        marked = pending.marked
        if visitor.in_tree(path) and stat.S_ISDIR(info.st_mode):
            if identity_of(info) == pending.identity:
                return fd, path, marked, info.st_dev
            if visitor.admit(path, info):  # swapped in between the listing and its handle
                return fd, path, False, info.st_dev
    except OSError:
        pass
    except BaseException:
        os.close(fd)
        raise
    os.close(fd)
    return None


class NewTrees:
    """The walks waiting, and the thread that walks them: `walk_on(walk, entries)` walks
    one slice (walk_slice) and returns the entries it used."""

    def __init__(
        self,
        walk_on: Callable[[TreeWalk, int], int],
        on_error: Callable[[str], None],
        clock: Callable[[], float] = time.monotonic,
    ):
        self._walk_on = walk_on
        self._on_error = on_error
        self._clock = clock
        self._walks: dict[int, deque[TreeWalk]] = {}  # owner -> her walks, in turn
        self._turns: deque[int] = deque()  # owners with walks waiting, the next first
        # the filesystems and handles of tops waiting, not started: once (a handle, not
        # st_ino: a directory made where a queued one was removed may reuse its inode
        # number, never its handle)
        self._queued: dict[tuple[int, fan.Handle], TreeWalk] = {}
        self._pending = 0
        self._tokens = float(BURST)
        self._filled_at = clock()
        self._busy = False
        self._stopping = False
        self._changed = threading.Condition()
        self._thread = threading.Thread(target=self._run, name="hpcsec-newtrees", daemon=True)
        self._thread.start()

    def put(self, walk: TreeWalk) -> str | None:
        """Queue the walk of a new directory; why not when there is no room."""
        owner = walk.owner
        with self._changed:
            queued = self._queued.get(walk.key)
            if queued is not None:  # moved in again before its walk began: once
                if queued.arrival is None:  # made, then moved out and in: its files moved in
                    queued.arrival = walk.arrival
                return None
            waiting = self._walks.get(owner)
            if waiting is not None and len(waiting) >= MAX_PENDING_PER_OWNER:
                return f"{MAX_PENDING_PER_OWNER:,} of its owner's already wait to be walked"
            if self._pending >= MAX_PENDING:
                return f"{MAX_PENDING:,} directories already wait to be walked"
            if waiting is None:
                waiting = self._walks[owner] = deque()
                self._turns.append(owner)
            waiting.append(walk)
            self._queued[walk.key] = walk
            self._pending += 1
            self._changed.notify_all()
        return None

    def wait_idle(self, timeout_s: float) -> bool:
        """Whether every walk queued so far was over within `timeout_s`."""
        with self._changed:
            return self._changed.wait_for(
                lambda: self._stopping or not (self._pending or self._busy), timeout_s
            )

    @property
    def alive(self) -> bool:
        """Whether the walker thread still runs (stop waits for it a while only)."""
        return self._thread.is_alive()

    def stop(self) -> None:
        with self._changed:
            self._stopping = True
            self._changed.notify_all()
        self._thread.join(timeout=_STOP_WAIT_S)
        if not self._thread.is_alive():  # else a slice may still use its walk's descriptor
            for waiting in self._walks.values():
                for walk in waiting:
                    walk.close()

    def _run(self) -> None:
        while True:
            with self._changed:
                self._busy = False
                self._changed.notify_all()
                self._changed.wait_for(lambda: self._stopping or self._pending)
                if not self._wait_for_tokens():
                    return
                owner = self._turns.popleft()
                waiting = self._walks[owner]
                walk = waiting.popleft()
                self._queued.pop(walk.key, None)
                self._busy = True
            try:
                used = self._walk_on(walk, SLICE_ENTRIES)
            except Exception as exc:  # one tree must not stop the walks of the others
                walk.close()
                used = 1
                with contextlib.suppress(Exception):
                    self._on_error(f"walking {walk.top}: {type(exc).__name__}: {exc}")
            with self._changed:
                self._tokens -= used
                if not walk.over:  # her walk goes on at her next turn, before her others
                    waiting.appendleft(walk)
                else:
                    self._pending -= 1
                if waiting:
                    self._turns.append(owner)
                else:
                    del self._walks[owner]

    def _wait_for_tokens(self) -> bool:
        """Wait (the lock held by the caller, released while waiting) until a slice may
        run; False once stopping."""
        while not self._stopping:
            now = self._clock()
            self._tokens = min(BURST, self._tokens + (now - self._filled_at) * RATE_PER_S)
            self._filled_at = now
            if self._tokens >= SLICE_ENTRIES:
                return True
            self._changed.wait((SLICE_ENTRIES - self._tokens) / RATE_PER_S)
        return False

"""The live fanotify stream behind the file-access sensor.

Permission events belong to the responder (responder.py), a process of its own that answers
each one within HOLD_S whatever this process is doing; it hands each access over a socket,
and this side matches it against the protected files, reads the opener's /proc entry while
the responder still holds it (so a `cat` that exits right after its open is still named),
and tells the responder it may let the opener go.

Marks cover only the protected files: each directory of a protected tree gets an inode mark
with FAN_EVENT_ON_CHILD, and each regular file one of its own, so an open is seen through any
path that reaches the file (a bind mount, also in a user namespace; another mount; a hard
link; a symlink) and recognised by identity (identity.py), not by the path string. Never a
mark on `/` or /proc: this process reads /proc, and its reads must never wait on an answer.
Marks are bounded in all and per owner (shares.py): a user's own directories use up that
user's share, not the marks that watch everyone else's files.

A second group in FID mode (FAN_REPORT_DFID_NAME), here, notifications only, reports
create, delete and rename, where the kernel supports it; otherwise the stream runs without
them and says so. A directory made in or moved into a protected tree is marked from its
create or rename event, and walked for what it already holds on a thread of its own
(newtrees.py); the files of one moved in are reported as moved in with it. The marks made
while the watch runs travel to the responder as descriptors (or a name in a directory's
descriptor) the watch opened by file handle or checked: no path is resolved again, so a
symlink swapped in meanwhile cannot move a mark out of the tree.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import functools
import os
import select
import stat
import threading
import time
from collections.abc import Callable

from hpcsec.detector.core.schema import rfc3339
from hpcsec.detector.core.switching import quick_thread_switches
from hpcsec.detector.core.text import escape_surrogates
from hpcsec.sensors import subuids
from hpcsec.sensors.base import SensorContext
from hpcsec.sensors.file_access import channel
from hpcsec.sensors.file_access import fanotify as fan
from hpcsec.sensors.file_access.identity import AssetIndex
from hpcsec.sensors.file_access.link import HOLD_S, ResponderLink
from hpcsec.sensors.file_access.newtrees import (
    NewTrees,
    TreeWalk,
    Visitor,
    open_checked,
    walk_slice,
)
from hpcsec.sensors.file_access.openers import OpenerCache
from hpcsec.sensors.file_access.records import Drained
from hpcsec.sensors.file_access.restart import RestartPolicy
from hpcsec.sensors.file_access.shares import (
    MAX_DIRS,
    MAX_DIRS_PER_OWNER,
    MAX_FILES,
    MAX_FILES_PER_OWNER,
    OwnerShares,
    identity_of,
)
from hpcsec.sensors.file_access.walk import walk_tree

CONTENT_MASK = fan.FAN_OPEN_PERM | fan.FAN_OPEN_EXEC_PERM | fan.FAN_ACCESS  # and writes:
CONTENT_MASK |= fan.FAN_MODIFY | fan.FAN_CLOSE_WRITE
FID_MASK = fan.FAN_CREATE | fan.FAN_DELETE | fan.FAN_ONDIR
_READ_SIZE = 4096
_ERROR_PAUSE_S = 0.01


class FanotifyWatch:
    def __init__(
        self,
        ctx: SensorContext,
        protected: Callable[[str], bool],
        folder,
        hold_s: float = HOLD_S,
    ):
        self.ctx = ctx
        self.openers = OpenerCache(ctx)
        self.protected = protected
        self.folder = folder
        self.hold_s = hold_s
        # a uid's owner: itself, or the user its subordinate range belongs to (subuids.py)
        self.owner_of = subuids.owners(ctx.etc)
        self.index = AssetIndex([], owner_of=self.owner_of)  # the watched roots, once marked
        self.notes: list[str] = []
        # what the shares left unwatched at start (shares.py): a status of its own
        self.unwatched_notes: list[str] = []
        self.own_pid = os.getpid()
        self.link: ResponderLink | None = None
        self.fid_fd = -1
        self.fid_mask = 0
        self._dir_shares, self._file_shares = self._new_shares()
        # the shares, taken by the reader thread and the new trees' walker (held only to
        # decide: a mark may wait for room on the responder's socket)
        self._marking = threading.RLock()
        self.new_trees: NewTrees | None = None  # started with the reader
        self._visitor = Visitor(
            self._new_subdir,
            self._admit_dir,
            self._in_tree,
            self._mark_dir,
            self._new_entry,
            self._count_unwatched,
        )
        self._real_roots: list[str] = []  # the watched trees' own paths (runtime events')
        self._mount_fds: dict[int, int] = {}  # statvfs f_fsid -> directory descriptor
        self._lock = threading.Lock()
        self._stop_r, self._stop_w = os.pipe()
        self._stopping = threading.Event()
        self._threads: list[threading.Thread] = []
        self._quick = contextlib.ExitStack()  # quick thread switches while it runs (start)
        # opens let through before the agent read the opener, since the last drain: the
        # responder's timeouts, and the opens it did not hold whose opener was gone
        self.answered_by_timeout = 0
        self.restart_policy = RestartPolicy()
        self.restarts = 0  # responders started again after one died, since the last drain
        self._errors = 0  # reads and events the reader could not handle, since the last drain
        self._last_error: str | None = None
        # new directories past their owner's share, since the last drain (not errors: a user
        # making directories in a loop must not hide the last real error)
        self._unwatched = 0
        self._last_unwatched: str | None = None

    @property
    def responder_pid(self) -> int | None:
        return None if self.link is None else self.link.process.pid

    @classmethod
    def start(
        cls,
        ctx: SensorContext,
        roots: list[str],
        protected: Callable[[str], bool],
        folder,
        hold_s: float = HOLD_S,
    ) -> FanotifyWatch:
        watch = cls(ctx, protected, folder, hold_s)
        try:
            watch._open_groups()
            watch.index.roots = [root for root in roots if watch._mark_tree(root)]
            watch._real_roots = [os.path.realpath(root) for root in watch.index.roots]
            watch.unwatched_notes += watch._dir_notes()
            watch.notes += watch._file_notes()
            assert watch.link is not None
            watch.link.sync(lambda frame: watch._frame(frame, rfc3339()))
            watch.index.build()
            index_note = watch.index.summary()
            if index_note is not None:
                watch.notes.append(index_note)
        except BaseException:
            watch.stop()
            raise
        watch.new_trees = NewTrees(watch._walk_new_tree, watch._error)
        thread = threading.Thread(target=watch._read_loop, name="hpcsec-fanotify", daemon=True)
        thread.start()
        watch._threads.append(thread)
        # An open of a protected file waits for the reader thread (held until it has named the
        # opener): it must get the GIL at once when another thread of the agent computes. At
        # CPython's default 5 ms switch interval, such an open took 16 ms at the median and
        # 144 ms at the 99th percentile while another thread computed; 1 ms and 2.3 ms with
        # quick switches (python -m bench file_access)
        watch._quick.enter_context(quick_thread_switches())
        return watch

    # setup
    def _open_groups(self) -> None:
        self.link = ResponderLink(self.hold_s)
        flags = fan.FAN_CLOEXEC | fan.FAN_NONBLOCK | fan.FAN_UNLIMITED_MARKS
        try:
            self.fid_fd = fan.init(fan.FAN_CLASS_NOTIF | fan.FAN_REPORT_DFID_NAME | flags)
        except OSError as exc:
            self.notes.append(
                f"create/delete/rename not reported: this kernel has no "
                f"fanotify FID mode ({exc.strerror})"
            )
            return
        self.fid_mask = FID_MASK | fan.FAN_RENAME

    def _mark_tree(self, root: str) -> bool:
        """Mark a protected tree (or file); False when it is not watched (a note says why)."""
        if not os.path.exists(root):
            self.notes.append(f"protected path {root} does not exist (not watched)")
            return False
        real = os.path.realpath(root)
        if real == "/" or real == "/proc" or real.startswith("/proc/"):
            # The reader reads /proc to name the opener: a mark there would have its reads
            # held by the responder for nothing.
            self.notes.append(f"protected path {root} not watched: it holds /proc")
            return False
        if not os.path.isdir(root):
            self._add_mount_fd(os.path.dirname(root) or "/")
            self._mark_file(root, named=True)
            self._mark_fid(os.path.dirname(root) or "/", 0)
            return True
        self._add_mount_fd(root)
        # Inode marks even on a tree that is a mount of its own: a mount mark would miss the
        # same files reached through a bind mount or another mount of the filesystem. The
        # root is marked whatever the shares say (the operator named it); below it, a
        # directory past its owner's share is neither marked nor walked (shares.py).
        self._dir_shares.take_path(root)
        for dirpath, names in walk_tree(root, self._remember_entry):
            # the root the operator named may be a symlink to the tree: its target is marked
            # (marks never follow one: _mark_dir)
            self._mark_dir(real if dirpath == root else dirpath)
            for name in names:
                self._mark_file(os.path.join(dirpath, name))
        return True

    def _remember_entry(self, entry: os.DirEntry[str]) -> bool:
        """A directory of the start's walk, charged by identity (newtrees.py: one moved out
        and in again while the watch runs is not charged twice)."""
        return self._dir_shares.take_entry(entry, remember=True)

    def _new_shares(self) -> tuple[OwnerShares, OwnerShares]:
        return (
            OwnerShares(MAX_DIRS, MAX_DIRS_PER_OWNER, self.owner_of),
            OwnerShares(MAX_FILES, MAX_FILES_PER_OWNER, self.owner_of),
        )

    def _dir_notes(self) -> list[str]:
        """The directories the shares left unwatched (an `unwatched` status: new files in
        them are not seen)."""
        note = self._dir_shares.summary(
            "directories", "not watched, nor walked (files created in them are not seen)"
        )
        return [] if note is None else [note]

    def _file_notes(self) -> list[str]:
        """The files past their owner's share of file marks (a `degraded` status: they are
        still seen through their directory's mark)."""
        note = self._file_shares.summary(
            "files", "not marked one by one (seen through their directory's mark only)"
        )
        return [] if note is None else [note]

    def _add_mount_fd(self, directory: str) -> None:
        """A descriptor on the filesystem of `directory`, for open_by_handle_at."""
        fsid = os.statvfs(directory).f_fsid
        if fsid not in self._mount_fds:
            self._mount_fds[fsid] = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)

    def _mark_dir(self, path: str, fd: int | None = None) -> None:
        """Never through a symlink (one swapped in for the directory since it was looked
        at). `fd`: the directory, open (newtrees.open_checked, or by handle in a walk), while
        the watch runs: both marks are made on the descriptor, whose path is not resolved
        again."""
        flags = fan.FAN_MARK_ONLYDIR | fan.FAN_MARK_DONT_FOLLOW
        self._mark(path, CONTENT_MASK | fan.FAN_EVENT_ON_CHILD, flags, fd)
        self._mark_fid(path, flags, fd)

    def _new_dir(self, path: str, fsid: int, arrival: tuple[int, str] | None = None) -> None:
        """A directory made in, or moved into, a protected tree while the watch runs (`path`
        as the OS takes it, read back from its parent's handle, on the filesystem `fsid`):
        marked within its owner's share, then queued to be walked for what it already holds
        (newtrees.py); else counted and reported as unwatched. Never through a symlink
        (open_checked), and queued by its handle (renamed before its walk, it is walked).
        `arrival`: the pid and time of the move that brought it in, whose walk reports each
        file found as moved in (_arrived_entry)."""
        mount_fd = self._mount_fds.get(fsid)
        fd = open_checked(path)
        if fd is None:
            return
        try:
            info = os.fstat(fd)
            identity = identity_of(info)
            with self._marking:
                taken = self._dir_shares.take(info.st_uid, identity)
                refusal = None if taken else self._dir_shares.refusal()
            if refusal is not None:
                self._count_unwatched(path, refusal)
                return
            self._mark_dir(path, fd)
            handle = fan.handle_at(fd)
        finally:
            os.close(fd)
        if self.new_trees is None or mount_fd is None or handle is None:
            return
        walk = TreeWalk(path, self.owner_of(info.st_uid), mount_fd, handle, identity, arrival)
        full = self.new_trees.put(walk)
        if full is not None:
            self._count_unwatched(path, f"what it holds is not walked: {full}")

    def _walk_new_tree(self, walk: TreeWalk, entries: int) -> int:
        """A slice of what a new directory holds (the walker's thread): its directories
        within their owners' shares, each marked before it is listed, and its files marked
        and indexed; those of a tree moved in are reported too (_arrived_entry)."""
        visitor = self._visitor
        if walk.arrival is not None:
            on_file = functools.partial(self._arrived_entry, walk.arrival, visitor.on_file)
            visitor = dataclasses.replace(visitor, on_file=on_file)
        return walk_slice(walk, entries, visitor)

    def _arrived_entry(
        self,
        arrival: tuple[int, str],
        adopt: Callable[[str, os.DirEntry[str], int], None],
        path: str,
        entry: os.DirEntry[str],
        dir_fd: int,
    ) -> None:
        """A file (or a symlink: one created is reported too) found in a tree moved into a
        protected one: marked and indexed (`adopt`: _new_entry), and, protected, reported
        as moved in by the move that brought its tree (`arrival`: its pid and time), since
        no event of its own says so: its directory moved, not it. The walk of a directory
        made in the tree reports nothing: what is made in it once it is marked has its
        create event."""
        adopt(path, entry, dir_fd)
        text = escape_surrogates(path)  # event text, as the FID events' paths
        if self.protected(text):
            pid, when = arrival
            self.folder.add(when, pid, text, "rename", target=text, asset=text)

    def _new_subdir(self, parent: str, entry: os.DirEntry[str]) -> int | None:
        """A subdirectory a walk met: the identity charged for it, None if refused."""
        with self._marking:
            shares = self._dir_shares
            refusals = shares.refusals
            if shares.take_entry(entry, parent, remember=True):
                return identity_of(entry.stat(follow_symlinks=False))  # cached by take_entry
            if shares.refusals != refusals:
                self._count_unwatched(os.path.join(parent, entry.name), shares.refusal())
            return None

    def _admit_dir(self, path: str, info: os.stat_result) -> bool:
        """A directory a walk opened that is not the inode it charged (swapped in between
        its listing and its handle): charged on its own, or refused and counted."""
        with self._marking:
            if self._dir_shares.take(info.st_uid, identity_of(info)):
                return True
            refusal = self._dir_shares.refusal()
        self._count_unwatched(path, refusal)
        return False

    def _new_entry(self, path: str, entry: os.DirEntry[str], dir_fd: int) -> None:
        """A file found in a new directory (`dir_fd` open on it): marked and indexed like
        one created there, by what its directory's descriptor shows (no path resolved)."""
        try:
            st = entry.stat(follow_symlinks=False)
        except OSError:
            return
        if not stat.S_ISLNK(st.st_mode):
            self._adopt_file(path, st, dir_fd)

    def _adopt_file(self, path: str, st: os.stat_result, dir_fd: int) -> None:
        """A file met while the watch runs, with its lstat through its directory's
        descriptor `dir_fd`: marked by its name there and indexed, no path resolved."""
        self._mark_file(path, st=st, dir_fd=dir_fd)
        self.index.add_seen(path, st)

    def _count_unwatched(self, path: str, why: str) -> None:
        with self._lock:
            self._unwatched += 1
            self._last_unwatched = f"{escape_surrogates(path)}: {why}"

    def _mark_file(
        self,
        path: str,
        named: bool = False,
        st: os.stat_result | None = None,
        dir_fd: int | None = None,
    ) -> None:
        """Its own mark, so a hard link in a directory nobody watches is seen too; within
        its owner's share unless the operator `named` it. `st` and `dir_fd`: its lstat and
        its directory, open (a new tree's walk): marked by its name there."""
        with self._marking:
            if not self._take_file(path, named, st):
                return
        flags = fan.FAN_MARK_DONT_FOLLOW
        if dir_fd is None:
            self._mark(path, CONTENT_MASK, flags)
        else:
            self._mark(path, CONTENT_MASK, flags, dir_fd, os.path.basename(path))

    def _take_file(self, path: str, named: bool, st: os.stat_result | None) -> bool:
        if not named:  # no lstat each past the bound in all, or in a spent owner's directory
            if self._file_shares.full:
                self._file_shares.refuse_unlooked()
                return False
            if self._file_shares.spent_in(os.path.dirname(path)):
                return False
        if st is None:
            try:
                st = os.lstat(path)
            except OSError:
                return False
        if stat.S_ISLNK(st.st_mode):
            return False
        # by identity: a file met again (a tree moved out and in, a hard link) is charged once
        return self._file_shares.take(st.st_uid, identity_of(st)) or named

    def _mark(
        self, path: str, mask: int, flags: int, fd: int | None = None, name: str = ""
    ) -> None:
        """The responder's mark on `path`, or with `fd` on that descriptor (or on `name` in
        the directory it is open on)."""
        link = self.link  # once: a responder restart may set it meanwhile
        if link is None:
            sent = False
        elif fd is None:
            sent = link.mark(flags, mask, path)
        else:
            sent = link.mark(flags, mask, name, fd)
        if not sent:
            self._error(f"{path} not watched: the fanotify responder does not answer")

    def _mark_fid(self, path: str, flags: int, fd: int | None = None) -> None:
        """The FID group's mark on `path`, or on the directory `fd` is open on."""
        if self.fid_fd < 0:
            return
        where = (fan.AT_FDCWD, path) if fd is None else (fd, None)
        try:
            try:
                fan.mark_at(self.fid_fd, fan.FAN_MARK_ADD | flags, self.fid_mask, *where)
            except OSError as exc:
                if exc.errno != errno.EINVAL or not self.fid_mask & fan.FAN_RENAME:
                    raise
                # Kernels before 5.17 have no FAN_RENAME: report the two halves of a move.
                self.fid_mask = FID_MASK | fan.FAN_MOVED_FROM | fan.FAN_MOVED_TO
                fan.mark_at(self.fid_fd, fan.FAN_MARK_ADD | flags, self.fid_mask, *where)
        except OSError as exc:  # e.g. a filesystem without file handles
            self.notes.append(f"create/delete/rename not reported under {path}: {exc.strerror}")

    # the stream
    def _read_loop(self) -> None:
        assert self.link is not None
        poller = select.poll()
        for fd in (self.link.fileno, self.fid_fd, self._stop_r):
            if fd >= 0:
                poller.register(fd, select.POLLIN)
        link_fd = self.link.fileno
        while not self._stopping.is_set():
            for fd, _ in poller.poll(self.restart_policy.wait_ms()):
                if fd == self._stop_r:
                    return
                when = rfc3339()  # one clock read per batch: formatting costs more than a read
                if fd == link_fd:
                    if not self._responder_frames(when):
                        poller.unregister(fd)
                        link_fd = -1
                        self.restart_policy.lost()
                    continue
                try:
                    buf = os.read(fd, _READ_SIZE)
                except BlockingIOError:
                    continue
                except OSError as exc:
                    self._error(f"read: {exc.strerror}")
                    time.sleep(_ERROR_PAUSE_S)
                    continue
                for event in fan.parse_events(buf):
                    try:
                        self._fid_event(event, when)
                    except Exception as exc:  # one bad event must not stop the others
                        self._error(f"{type(exc).__name__}: {exc}")
            if link_fd < 0 and self.restart_policy.take():
                link_fd = self._restart_responder()
                if link_fd >= 0:
                    poller.register(link_fd, select.POLLIN)
                else:
                    self.restart_policy.lost()

    def _restart_responder(self) -> int:
        """A new responder with the marks of the watched roots: its socket, or -1. Until it
        runs the node is not blocked (the dead one's marks went with it) but opens are not
        seen, so it is started again at once, within restart.py's bounds."""
        old, self.link = self.link, None
        if old is not None:
            old.stop()  # reaps the dead process and closes our end
        try:
            self.link = ResponderLink(self.hold_s)
            with self._marking:
                self._dir_shares, self._file_shares = self._new_shares()
                for root in self.index.roots:
                    self._mark_tree(root)
            self.link.sync(lambda frame: self._frame(frame, rfc3339()))
        except OSError as exc:
            self._error(f"the fanotify responder could not be restarted: {exc}")
            return -1
        with self._lock:
            self.restarts += 1
        return self.link.fileno

    def _responder_frames(self, when: str) -> bool:
        """Handle what the responder handed over; False once it is gone."""
        assert self.link is not None
        for frame in self.link.recv_ready():
            if not frame:
                self._error("the fanotify responder exited: opens of protected files not seen")
                return False
            try:
                self._frame(frame, when)
            except Exception as exc:  # one bad access must not stop the others
                self._error(f"{type(exc).__name__}: {exc}")
        return True

    def _frame(self, frame: bytes, when: str) -> None:
        kind = frame[:1]
        if kind == channel.ACCESS:
            self._access(channel.parse_access(frame), when)
        elif kind == channel.COUNTERS:
            self._count(*channel.parse_counters(frame))
        elif kind == channel.NOTE:
            self._error(frame[1:].decode("utf-8", "replace"))

    def _count(self, dropped: int, timeouts: int) -> None:
        if dropped:
            self.folder.drop(dropped)
        if timeouts:
            with self._lock:  # drain takes and zeroes it from the agent's thread
                self.answered_by_timeout += timeouts

    def _error(self, what: str) -> None:
        with self._lock:
            self._errors += 1
            self._last_error = what

    def _access(self, access: channel.Access, when: str) -> None:
        self._count(access.dropped, access.timeouts)
        permission = access.mask & fan.PERMISSION_EVENTS
        try:
            asset = self._asset_of(access)
            if asset is None:
                return
            if permission:
                # held (access.held), the opener waits for us: its /proc entry is there
                named = self.openers.remember(access.pid, fresh=True)
                if not (named or access.held):
                    # Let through unheld (the agent was late: after a timeout, until it
                    # answers again, or past MAX_HELD) and gone before we read it: counted
                    # with the timeouts, so that the `answer_timeout` status accounts for
                    # every open whose events name the opener by pid alone.
                    self._count(0, 1)
            size = access.size if permission or access.mask & fan.FAN_CLOSE_WRITE else None
            seen = access.path or asset
            actions = fan.actions_of(access.mask)
            self.folder.add_actions(when, access.pid, seen, actions, size, None, asset)
        finally:
            if permission and self.link is not None:
                self.link.ack(access.seq)

    def _asset_of(self, access: channel.Access) -> str | None:
        """The protected file's own path, whatever path the opener used (None: not one)."""
        asset = self.index.lookup(access.dev, access.ino)
        if asset is None:
            if not access.path or not self.protected(access.path):
                return None
            self.index.learn(access.dev, access.ino, access.path)  # new since the last walk
            return access.path
        return asset if self.protected(asset) else None

    def _fid_event(self, event: fan.RawEvent, when: str) -> None:
        if event.mask & fan.FAN_Q_OVERFLOW:
            self.folder.drop()
            return
        if event.pid == self.own_pid:
            return
        paths = {fid.info_type: self._id_path(fid) for fid in event.ids}
        old = paths.get(fan.INFO_OLD_DFID_NAME) or paths.get(fan.INFO_DFID_NAME)
        new = paths.get(fan.INFO_NEW_DFID_NAME)
        # A move's two ends: FAN_RENAME names the old one only where its directory is
        # watched, the new one only where its new directory is (a file moved in from
        # elsewhere comes with its new name alone, one moved out with its old name alone);
        # before 5.17, the two halves come as events of their own.
        moved = event.mask & (fan.FAN_RENAME | fan.FAN_MOVED_FROM | fan.FAN_MOVED_TO)
        if event.mask & fan.FAN_RENAME:
            src, dst = paths.get(fan.INFO_OLD_DFID_NAME), new
        else:  # each half names its own end, in its one record
            src = old if event.mask & fan.FAN_MOVED_FROM else None
            dst = old if event.mask & fan.FAN_MOVED_TO else None
        is_dir = bool(event.mask & fan.FAN_ONDIR)
        if is_dir:  # directories are containers; the files in them are the assets
            # A directory made in a marked one (a create reaches only its parent's mark), or
            # moved in from outside the watched trees, is marked and walked (_new_dir), by
            # the path the OS takes, whatever bytes its name holds. One renamed within a
            # tree keeps its marks (they follow the inode). A move of it is reported as a
            # file's is, and the walk of one moved in reports each file it holds as moved
            # in with it (the mover's pid and time): a tree planted in one rename.
            kind = None
            if event.mask & fan.FAN_CREATE and old:
                kind = fan.INFO_DFID_NAME
            elif event.mask & fan.FAN_RENAME and new and not (old and self._in_tree(old)):
                kind = fan.INFO_NEW_DFID_NAME
            elif event.mask & fan.FAN_MOVED_TO and old:  # before 5.17: from where, unknown
                kind = fan.INFO_DFID_NAME
            fid = next((f for f in event.ids if f.info_type == kind), None)
            target = None if fid is None else self._id_path(fid, as_text=False)
            if fid is not None and target is not None and self._in_tree(target):
                arrival = (event.pid, when) if moved else None
                with contextlib.suppress(OSError):
                    self._new_dir(target, fid.fsid, arrival)
            if moved:
                self._moved(event.pid, when, src, dst)
            return
        # A filesystem mark reports the whole filesystem: /proc is read only for what is kept.
        if moved:
            if self._moved(event.pid, when, src, dst) and dst is not None:
                renamed = event.mask & fan.FAN_RENAME
                self._new_file(event, fan.INFO_NEW_DFID_NAME if renamed else fan.INFO_DFID_NAME)
            if not event.mask & (fan.FAN_CREATE | fan.FAN_DELETE):  # else merged with it
                return
        action = (
            "create"
            if event.mask & fan.FAN_CREATE
            else "delete"
            if event.mask & fan.FAN_DELETE
            else None
        )
        path = old or new
        if action and path and self.protected(path):
            if action != "delete":
                kinds = (fan.INFO_OLD_DFID_NAME, fan.INFO_DFID_NAME, fan.INFO_NEW_DFID_NAME)
                kind = next(k for k in kinds if paths.get(k))  # the record `path` came from
                self._new_file(event, kind)
            self.openers.remember(event.pid, fresh=False)
            self.folder.add(when, event.pid, path, action, asset=path)

    def _moved(self, pid: int, when: str, src: str | None, dst: str | None) -> bool:
        """A move of a file or directory from `src` to `dst` (None: not under a watched
        directory, or before 5.17 the other half's own event), reported about the protected
        end: moved out or within, the old path (`file.path`, and the asset), the new one as
        its target; moved in from elsewhere, where it now lies (`file.path`, the asset and
        the target alike: the file the rules and site policy must judge is the protected
        one, its name, extension and directory). False when neither end is protected."""
        if src is not None and self.protected(src):
            path, target = src, dst
        elif dst is not None and self.protected(dst):
            path, target = dst, dst
        else:
            return False
        self.openers.remember(pid, fresh=False)
        self.folder.add(when, pid, path, "rename", target=target, asset=path)
        return True

    def _in_tree(self, path: str) -> bool:
        """Whether a path read back from a handle lies in a watched tree."""
        return any(
            path == root or path.startswith(root.rstrip("/") + "/") for root in self._real_roots
        )

    def _new_file(self, event: fan.RawEvent, info_type: int) -> None:
        """A file created or moved under a protected tree (the event's record `info_type`):
        marked and indexed like the rest, by its name in the directory its handle opens, so
        that no path is resolved again (a directory of it swapped for a symlink meanwhile
        would put the mark, and the protected name, on a file elsewhere)."""
        fid = next((f for f in event.ids if f.info_type == info_type), None)
        mount_fd = None if fid is None else self._mount_fds.get(fid.fsid)
        if fid is None or mount_fd is None or not fid.os_name:
            return
        try:
            dir_fd = fan.open_handle(mount_fd, fid)
        except OSError:
            return
        try:
            st = os.stat(fid.os_name, dir_fd=dir_fd, follow_symlinks=False)
            path = os.path.join(os.readlink(f"/proc/self/fd/{dir_fd}"), fid.os_name)
            if self._in_tree(path) and not stat.S_ISLNK(st.st_mode):
                self._adopt_file(path, st, dir_fd)
        except OSError:
            pass
        finally:
            os.close(dir_fd)

    def _id_path(self, fid: fan.FileId, as_text: bool = True) -> str | None:
        """The path an FID record names: as event text, or as the OS takes it."""
        mount_fd = self._mount_fds.get(fid.fsid)
        directory = None if mount_fd is None else fan.handle_path(mount_fd, fid, as_text)
        if directory is None:
            return None
        name = fid.name if as_text else fid.os_name
        return os.path.join(directory, name) if name else directory

    # the sensor side
    def pending(self) -> bool:
        """Accesses, drops or reader errors waiting: lock-free, for the agent's cheap poll."""
        return bool(
            self.folder.records
            or self.folder.dropped
            or self._errors
            or self._unwatched
            or self.answered_by_timeout
            or self.restarts
        )

    def drain(self) -> Drained:
        records, dropped = self.folder.drain()
        with self._lock:
            errors, last_error, self._errors, self._last_error = (
                self._errors,
                self._last_error,
                0,
                None,
            )
            timeouts, self.answered_by_timeout = self.answered_by_timeout, 0
            restarts, self.restarts = self.restarts, 0
            unwatched = (self._unwatched, self._last_unwatched)
            self._unwatched, self._last_unwatched = 0, None
        processes, proc_inputs = self.openers.take({r.pid for r in records})
        self.index.rebuild_if_due()
        return Drained(
            records,
            dropped,
            processes,
            proc_inputs,
            errors,
            last_error,
            timeouts,
            restarts,
            *unwatched,
        )

    def stop(self) -> None:
        self._quick.close()  # once: a second close has nothing left to undo
        self._stopping.set()
        if self.new_trees is not None:
            self.new_trees.stop()
        with contextlib.suppress(OSError):
            os.write(self._stop_w, b"x")
        for thread in self._threads:
            thread.join(timeout=5)
        if self.link is not None:
            self.link.stop()  # the responder exits; its group, marks and held opens go with it
        # a walker still in a slice (stop waits for it a while only) opens handles through
        # the mount descriptors: they stay open until it is gone (the process exits)
        walking = self.new_trees is not None and self.new_trees.alive
        groups = () if walking else (self.fid_fd, *self._mount_fds.values())  # FID group too
        for fd in (self._stop_r, self._stop_w, *groups):
            if fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(fd)
        if not walking:
            self.fid_fd = -1
            self._mount_fds = {}

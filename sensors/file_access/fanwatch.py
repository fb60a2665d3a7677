"""The live fanotify stream behind the file-access sensor.

Marks cover only the protected paths: each directory of a protected tree gets an inode mark
with FAN_EVENT_ON_CHILD (a tree that is a mount of its own gets one mount mark). Never a
mark on `/`: the sensor reads /proc and writes snapshots, and a permission event on
its own reads would wait for an answer only it can give.

The content group asks for FAN_OPEN_PERM: the opener is blocked until we answer, so its
/proc entry is still there when we read it — that is how a `cat` that exits right after
the open is still attributed. Every permission event is answered FAN_ALLOW (this sensor
observes, it does not enforce); the reader answers right after the /proc read, and a
watchdog answers any that wait longer than `answer_timeout_s` (a /proc read can stall).

A second group in FID mode (FAN_REPORT_DFID_NAME) reports create, delete and rename, where
the kernel supports it; otherwise the stream runs without them and says so.
"""

from __future__ import annotations

import contextlib
import errno
import os
import select
import threading
import time
from collections.abc import Callable
from typing import Any

from hpcsec.detector.core.schema import rfc3339
from hpcsec.sensors.base import FsRoot, SensorContext
from hpcsec.sensors.file_access import fanotify as fan
from hpcsec.sensors.file_access.records import (
    Drained,
    ProcCapture,
    ProcInput,
    access_process_fields,
)
from hpcsec.sensors.procinfo import Users

CONTENT_MASK = (
    fan.FAN_OPEN_PERM
    | fan.FAN_OPEN_EXEC_PERM
    | fan.FAN_ACCESS
    | fan.FAN_MODIFY
    | fan.FAN_CLOSE_WRITE
)
FID_MASK = fan.FAN_CREATE | fan.FAN_DELETE | fan.FAN_ONDIR
_NO_USERS = Users({})  # names are filled in at conversion, from the sample's passwd
# Each event in a read() comes with an open descriptor; small batches keep few open, and
# resolving /proc/self/fd/N gets slower the more there are (measured: 4.6 us at 4 KiB
# batches, 8.8 us at 64 KiB).
_READ_SIZE = 4096
_MAX_PROCESSES = 16_384
_REREAD_S = 1.0
_ERROR_PAUSE_S = 0.01
IDLE_AFTER_S = 5.0  # the watchdog sleeps after this long without permission events


class FanotifyWatch:
    def __init__(
        self,
        ctx: SensorContext,
        protected: Callable[[str], bool],
        folder,
        answer_timeout_s: float = 0.5,
    ):
        self.ctx = ctx
        # The reader reads /proc through its own root: when a snapshot is being recorded,
        # what it read is kept per pid and written into the sample that gets the records.
        self._capture = ProcCapture() if ctx.recorder is not None else None
        self._proc_ctx = SensorContext(
            ctx.host_name,
            ctx.sys,
            FsRoot("proc", ctx.proc.path, self._capture),
            ctx.etc,
            timestamp=ctx.timestamp,
        )
        self._proc_inputs: dict[int, tuple[ProcInput, ...]] = {}
        self.protected = protected
        self.folder = folder
        self.answer_timeout_s = answer_timeout_s
        self.notes: list[str] = []
        self.own_pid = os.getpid()
        self.content_fd = -1
        self.fid_fd = -1
        self.fid_mask = 0
        self._mount_fds: dict[int, int] = {}  # statvfs f_fsid -> directory descriptor
        self._processes: dict[int, dict[str, Any]] = {}
        self._read_at: dict[int, float] = {}  # pid -> monotonic time of its /proc read
        self._pending: dict[int, float] = {}  # event fd -> deadline of its answer
        self._answer_lock = threading.Lock()
        self._stop_r, self._stop_w = os.pipe()
        self._stopping = threading.Event()
        self._wakeup = threading.Event()  # set by the reader when the watchdog sleeps
        self._idle = False
        self._threads: list[threading.Thread] = []
        self.answered_by_watchdog = 0
        self._errors = 0  # reads and events the reader could not handle, since the last drain
        self._last_error: str | None = None

    @classmethod
    def start(
        cls,
        ctx: SensorContext,
        roots: list[str],
        protected: Callable[[str], bool],
        folder,
        answer_timeout_s: float = 0.5,
    ) -> FanotifyWatch:
        watch = cls(ctx, protected, folder, answer_timeout_s)
        try:
            watch._open_groups()
            for root in roots:
                watch._mark_tree(root)
        except BaseException:
            watch.stop()
            raise
        for target in (watch._read_loop, watch._watchdog):
            thread = threading.Thread(target=target, name=f"hpcsec-{target.__name__}", daemon=True)
            thread.start()
            watch._threads.append(thread)
        return watch

    # setup
    def _open_groups(self) -> None:
        flags = fan.FAN_CLOEXEC | fan.FAN_NONBLOCK | fan.FAN_UNLIMITED_MARKS
        self.content_fd = fan.init(fan.FAN_CLASS_CONTENT | flags)
        try:
            self.fid_fd = fan.init(fan.FAN_CLASS_NOTIF | fan.FAN_REPORT_DFID_NAME | flags)
        except OSError as exc:
            self.notes.append(
                f"create/delete/rename not reported: this kernel has no "
                f"fanotify FID mode ({exc.strerror})"
            )
            return
        self.fid_mask = FID_MASK | fan.FAN_RENAME

    def _mark_tree(self, root: str) -> None:
        if not os.path.exists(root):
            self.notes.append(f"protected path {root} does not exist (not watched)")
            return
        real = os.path.realpath(root)
        if real == "/" or real == "/proc" or real.startswith("/proc/"):
            # The reader reads /proc to name the opener: a mark there would have it wait
            # on a permission event that only it can answer.
            self.notes.append(f"protected path {root} not watched: it holds /proc")
            return
        if not os.path.isdir(root):
            self._add_mount_fd(os.path.dirname(root) or "/")
            self._mark(root, CONTENT_MASK, 0)
            self._mark_fid(os.path.dirname(root) or "/", 0)
            return
        self._add_mount_fd(root)
        if os.path.ismount(root) and root != "/":
            # One mark for the whole mount. Permission events on the mount only: a filesystem
            # mark would also hold every open through other mounts of that filesystem (a
            # scratch directory of the same Lustre). Mount marks cannot report create/delete/
            # rename, so the FID group (notifications, nobody waits) marks the filesystem.
            self._mark(root, CONTENT_MASK, fan.FAN_MARK_MOUNT)
            self._mark_fid(root, fan.FAN_MARK_FILESYSTEM)
            return
        for dirpath, _, _ in os.walk(root):
            self._mark_dir(dirpath)

    def _add_mount_fd(self, directory: str) -> None:
        """A descriptor on the filesystem of `directory`, for open_by_handle_at."""
        fsid = os.statvfs(directory).f_fsid
        if fsid not in self._mount_fds:
            self._mount_fds[fsid] = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)

    def _mark_dir(self, path: str) -> None:
        self._mark(path, CONTENT_MASK | fan.FAN_EVENT_ON_CHILD, fan.FAN_MARK_ONLYDIR)
        self._mark_fid(path, fan.FAN_MARK_ONLYDIR)

    def _mark(self, path: str, mask: int, flags: int) -> None:
        fan.mark(self.content_fd, fan.FAN_MARK_ADD | flags, mask, path)

    def _mark_fid(self, path: str, flags: int) -> None:
        if self.fid_fd < 0:
            return
        try:
            try:
                fan.mark(self.fid_fd, fan.FAN_MARK_ADD | flags, self.fid_mask, path)
            except OSError as exc:
                if exc.errno != errno.EINVAL or not self.fid_mask & fan.FAN_RENAME:
                    raise
                # Kernels before 5.17 have no FAN_RENAME: report the two halves of a move.
                self.fid_mask = FID_MASK | fan.FAN_MOVED_FROM | fan.FAN_MOVED_TO
                fan.mark(self.fid_fd, fan.FAN_MARK_ADD | flags, self.fid_mask, path)
        except OSError as exc:  # e.g. a filesystem without file handles
            self.notes.append(f"create/delete/rename not reported under {path}: {exc.strerror}")

    # the stream
    def _read_loop(self) -> None:
        poller = select.poll()
        for fd in (self.content_fd, self.fid_fd, self._stop_r):
            if fd >= 0:
                poller.register(fd, select.POLLIN)
        while not self._stopping.is_set():
            for fd, _ in poller.poll():
                if fd == self._stop_r:
                    return
                try:
                    buf = os.read(fd, _READ_SIZE)
                except BlockingIOError:
                    continue
                except OSError as exc:
                    # Never give up: permission events nobody reads keep their openers
                    # waiting until the group closes. On EMFILE (no descriptor for an
                    # event) the kernel denies that one event itself; the next may pass.
                    self._error(f"read: {exc.strerror}")
                    time.sleep(_ERROR_PAUSE_S)
                    continue
                when = rfc3339()  # one clock read per batch: formatting costs more than a read
                handle = self._content_event if fd == self.content_fd else self._fid_event
                for event in fan.parse_events(buf):
                    try:
                        handle(event, when)
                    except Exception as exc:  # one bad event must not stop the others' answers
                        self._error(f"{type(exc).__name__}: {exc}")

    def _error(self, what: str) -> None:
        with self._answer_lock:
            self._errors += 1
            self._last_error = what

    def _content_event(self, event: fan.RawEvent, when: str) -> None:
        if event.mask & fan.FAN_Q_OVERFLOW:
            self.folder.drop()
            return
        permission = event.mask & fan.PERMISSION_EVENTS
        if permission:
            with self._answer_lock:
                self._pending[event.fd] = time.monotonic() + self.answer_timeout_s
            if self._idle:  # only a sleeping watchdog needs waking
                self._wakeup.set()
        try:
            if event.pid == self.own_pid:
                return
            path = fan.fd_path(event.fd)
            if path is None or not self.protected(path):
                return
            if permission:
                self._remember(event.pid, fresh=True)  # before the answer: the opener waits
            size = None
            if permission or event.mask & fan.FAN_CLOSE_WRITE:
                with contextlib.suppress(OSError):
                    size = os.fstat(event.fd).st_size
            self.folder.add_actions(when, event.pid, path, fan.actions_of(event.mask), size)
        finally:
            if permission:
                self._answer(event.fd)
            if event.fd >= 0:
                os.close(event.fd)  # the reader's alone: the watchdog never closes it

    def _answer(self, event_fd: int) -> None:
        """Allow a permission event once, whoever (reader or watchdog) comes first."""
        with self._answer_lock:
            if self._pending.pop(event_fd, None) is None:
                return
            with contextlib.suppress(OSError):
                fan.respond(self.content_fd, event_fd, allow=True)

    def _watchdog(self) -> None:
        # While permission events come, it checks every half timeout (as cheap as a timer);
        # after IDLE_AFTER_S without any it sleeps until the reader wakes it, so an idle node
        # pays no wake-ups. Before sleeping it looks once more, so an event queued meanwhile
        # (whose reader may be the one that is stuck) is never left without a watchdog.
        quiet_since = time.monotonic()
        while not self._stopping.is_set():
            now = time.monotonic()
            with self._answer_lock:
                late = [fd for fd, deadline in self._pending.items() if deadline <= now]
                waiting = bool(self._pending)
            for fd in late:
                self.answered_by_watchdog += 1
                self._answer(fd)
            if waiting:
                quiet_since = now
            elif now - quiet_since >= IDLE_AFTER_S:
                self._idle = True
                with self._answer_lock:
                    waiting = bool(self._pending)
                if not waiting:
                    self._wakeup.wait()
                self._wakeup.clear()
                self._idle = False
                quiet_since = time.monotonic()
                continue
            self._stopping.wait(self.answer_timeout_s / 2)

    def _fid_event(self, event: fan.RawEvent, when: str) -> None:
        if event.mask & fan.FAN_Q_OVERFLOW:
            self.folder.drop()
            return
        if event.pid == self.own_pid:
            return
        paths = {fid.info_type: self._id_path(fid) for fid in event.ids}
        old = paths.get(fan.INFO_OLD_DFID_NAME) or paths.get(fan.INFO_DFID_NAME)
        new = paths.get(fan.INFO_NEW_DFID_NAME)
        is_dir = bool(event.mask & fan.FAN_ONDIR)
        if event.mask & fan.FAN_CREATE and is_dir and old:
            with contextlib.suppress(OSError):
                self._mark_dir(old)  # a new subdirectory of a protected tree
        if is_dir:
            return  # directories are containers; the files in them are the assets
        # A filesystem mark reports the whole filesystem: /proc is read only for what is kept.
        if event.mask & fan.FAN_RENAME and old and new:
            if self.protected(old) or self.protected(new):
                self._remember(event.pid, fresh=False)
                self.folder.add(when, event.pid, old, "rename", target=new)
            return
        action = (
            "create"
            if event.mask & fan.FAN_CREATE
            else "delete"
            if event.mask & fan.FAN_DELETE
            else "rename"
            if event.mask & (fan.FAN_MOVED_FROM | fan.FAN_MOVED_TO)
            else None
        )
        path = old or new
        if action and path and self.protected(path):
            self._remember(event.pid, fresh=False)
            self.folder.add(when, event.pid, path, action)

    def _id_path(self, fid: fan.FileId) -> str | None:
        mount_fd = self._mount_fds.get(fid.fsid)
        directory = None if mount_fd is None else fan.handle_path(mount_fd, fid)
        if directory is None:
            return None
        return os.path.join(directory, fid.name) if fid.name else directory

    def _remember(self, pid: int, fresh: bool) -> None:
        """Process fields of `pid` at the access (through ctx.proc, so snapshots keep them).

        An open re-reads them unless this pid was read in the last `_REREAD_S` (a loader
        opening shard after shard pays the /proc read once; an exec or a reused pid is
        seen again within a second).
        """
        now = time.monotonic()
        if pid in self._processes and (not fresh or now - self._read_at.get(pid, 0) < _REREAD_S):
            return
        if self._capture is not None:
            self._capture.inputs = []
        fields = access_process_fields(self._proc_ctx, pid, _NO_USERS)
        if fields or pid not in self._processes:
            self._processes[pid] = fields
            self._read_at[pid] = now
            if self._capture is not None:
                self._proc_inputs[pid] = tuple(self._capture.inputs)

    # the sensor side
    def pending(self) -> bool:
        """Accesses, drops or reader errors waiting: lock-free, for the agent's cheap poll."""
        return bool(self.folder.records or self.folder.dropped or self._errors)

    def drain(self) -> Drained:
        records, dropped = self.folder.drain()
        with self._answer_lock:
            errors, last_error, self._errors, self._last_error = (
                self._errors,
                self._last_error,
                0,
                None,
            )
        pids = {r.pid for r in records}
        processes = {pid: self._processes[pid] for pid in pids if pid in self._processes}
        proc_inputs = {pid: self._proc_inputs[pid] for pid in pids if pid in self._proc_inputs}
        # Kept across intervals (a dataloader opened its shard long before it reads it);
        # every open refreshes its pid's entry, so only a bound is needed.
        if len(self._processes) > _MAX_PROCESSES:
            self._processes, self._read_at, self._proc_inputs = {}, {}, {}
        return Drained(records, dropped, processes, proc_inputs, errors, last_error)

    def stop(self) -> None:
        self._stopping.set()
        self._wakeup.set()
        with contextlib.suppress(OSError):
            os.write(self._stop_w, b"x")
        for thread in self._threads:
            thread.join(timeout=5)
        with self._answer_lock:
            pending, self._pending = list(self._pending), {}
        for fd in pending:  # closing the group also allows them; be explicit
            with contextlib.suppress(OSError):
                fan.respond(self.content_fd, fd, allow=True)
        for fd in (
            self.content_fd,
            self.fid_fd,
            self._stop_r,
            self._stop_w,
            *self._mount_fds.values(),
        ):
            if fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(fd)
        self.content_fd = self.fid_fd = -1
        self._mount_fds = {}

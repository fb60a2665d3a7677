"""Reads that a process's owner can make hang: /proc/<pid>/cmdline and environ.

Those files are the process's own memory, read by the kernel from its address space. A user
who maps a file of their own FUSE file system over the pages that hold their process's
arguments (munmap, then mmap at the same address) makes every read of that process's cmdline
wait for an answer their FUSE daemon never gives: the reading thread blocks in the kernel and
no signal short of its process's death frees it. Unguarded, the process sensor stopped at
that process at every sample and reported nothing more, for every user of the node.

Every such read goes through `guarded`. Two ways, by thread:
- A sensor's own thread (`watched()`): the read is made in place, and says which process it
  reads (a dict entry, nothing more on the agent's hottest path). Whoever runs the sensor
  asks, while it waits, whether the thread has been in one read for STALL_S (`stalled`) and
  then gives the thread up (`abandon`) and runs the sensor again in a new one.
- Any other thread (enrichment, Slurm attribution, the file-access watch): the read is made
  by a reader thread, waited for at most STALL_S; a reader stuck past that is given up and
  a new one takes the reads after it.

A process a given-up read is stuck on is quarantined: its memory is not read (Quarantined),
and its events come without what could not be read, marked `process.memory_read_stalled`
(a rule alerts on it: no program hides its arguments behind a file system that does not
answer by accident). When the given-up read returns at last (the daemon answered or died),
its thread lifts the quarantine and ends: a sensor's run raises Abandoned there and is
dropped. At most MAX_ABANDONED threads are given up and still blocked: past that a stalled
sensor is reported slow, and while the reader is stuck the other threads' reads are refused
(NoReader: not read, and not marked, as nothing is known of those processes), so that a
node's hostile processes cannot pile up blocked threads in the agent.

That bound is shared, so one user must not use it up: once MAX_STUCK_PER_OWNER given-up
reads of one owner's processes are blocked, the memory of that owner's other processes is
not read either (OwnerStalled: their events are marked `process.memory_read_skipped`),
until those reads return. Else a user with a few more processes than MAX_ABANDONED whose
arguments hang would leave the process sensor stuck for every user of the node. The caller
names the owner before the read (a process may exit while its read is stuck):
procinfo.owner_key, the real uid, or for a rootless container's process the user its
subordinate uid belongs to; processes whose owner is not known are one owner together.
"""

from __future__ import annotations

import contextlib
import queue
import threading
from collections.abc import Callable, Iterator
from threading import get_ident
from time import monotonic
from typing import Any, TypeVar

from hpcsec.detector.core.log import get_logger

T = TypeVar("T")
logger = get_logger(__name__)

STALL_S = 2.0  # one read of a process's memory this long: the thread is given up
MAX_ABANDONED = 16  # threads given up and still blocked, at most
MAX_STUCK_PER_OWNER = 2  # of them, on one owner's processes (then theirs are not read)

_lock = threading.Lock()
# A process: its pid and its start time (/proc/<pid>/stat), as a pid alone is reused. A
# stuck read pins the process's memory, not its pid: the kernel gives the pid to another
# process when this one exits, and that one's memory is read as any other's.
Started = Callable[[], "int | None"]  # the start time of the process read, when asked
Reading = tuple[int, float, Started, "int | None"]  # a read: pid, since when, start, owner
Process = tuple[int, "int | None"]  # pid, start time
_reading: dict[int, Reading] = {}  # thread ident -> its read
# thread ident -> the process it is stuck on, and that process's owner
_abandoned: dict[int, tuple[Process, int | None]] = {}
_quarantined: dict[Process, int] = {}  # process -> given-up reads still blocked
_quarantined_pids: dict[int, int] = {}  # their pids, counted: the quick check of a read
# owner (None: not known) -> given-up reads of its processes still blocked
_stuck_owners: dict[int | None, int] = {}
_local = threading.local()  # .watched: reads of this thread are watched by its runner


class Abandoned(Exception):
    """A given-up read returned: its run was replaced, and ends here."""


class Quarantined(Exception):
    """The process's memory is not read: a read of it is stuck (see the module's docstring)."""


class NoReader(Exception):
    """Not read: the reader is stuck on another process and MAX_ABANDONED are given up."""


class OwnerStalled(Exception):
    """Not read: MAX_STUCK_PER_OWNER reads of other processes of its owner are stuck."""


@contextlib.contextmanager
def watched() -> Iterator[None]:
    """Reads of the calling thread are made in place: its runner watches for stalls."""
    _local.watched = True
    try:
        yield
    finally:
        _local.watched = False


def _unknown_start() -> int | None:
    return None


def guarded(
    pid: int,
    read: Callable[[], T],
    started: Started = _unknown_start,
    owner: int | None = None,
) -> T:
    """`read()` of process `pid`'s memory; raises Quarantined for a process a read of which
    is stuck, and, in a thread that is not watched, for one whose read stalls now;
    OwnerStalled for a process of an owner with MAX_STUCK_PER_OWNER stuck reads.
    `started()`: the process's start time, read only when a read of that pid is stuck;
    `owner`: who answers for it (procinfo.owner_key; None: not known)."""
    if _stuck_owners and not _is_quarantined(pid, started) and _owner_stalled(owner):
        raise OwnerStalled(pid)
    if _local.__dict__.get("watched"):
        return _in_place(pid, read, started, owner)
    return _by_reader(pid, read, started, owner)


def _owner_stalled(owner: int | None) -> bool:
    with _lock:
        return _stuck_owners.get(owner, 0) >= MAX_STUCK_PER_OWNER


def _is_quarantined(pid: int, started: Started) -> bool:
    """Whether this process (not only this pid) is quarantined; one dict lookup unless a
    read of its pid is stuck."""
    if pid not in _quarantined_pids:
        return False
    start = started()
    with _lock:
        return (pid, start) in _quarantined or (start is None and pid in _quarantined_pids)


def _in_place(pid: int, read: Callable[[], T], started: Started, owner: int | None) -> T:
    # no lock on the way (the agent's process sensor makes two such reads a process): only
    # this thread sets or ends its entry, and abandon() looks at the entry again after
    # marking the thread, so that one of the two always sees the other (see there)
    if _is_quarantined(pid, started):
        raise Quarantined(pid)
    ident = get_ident()
    _reading[ident] = (pid, monotonic(), started, owner)
    try:
        return read()
    finally:
        stuck_on = _done_reading(ident)
        if stuck_on is not None:
            raise Abandoned(stuck_on)


def _done_reading(ident: int) -> int | None:
    """The thread's read is over: the pid it was given up on, if it was (unquarantined)."""
    del _reading[ident]
    if not _abandoned or ident not in _abandoned:
        return None
    with _lock:
        stuck_on = _abandoned.pop(ident, None)
        if stuck_on is None:
            return None
        process, owner = stuck_on
        _count(_quarantined, process, -1)
        _count(_quarantined_pids, process[0], -1)
        _count(_stuck_owners, owner, -1)
        return process[0]


def _count(counts: dict, key: object, by: int) -> None:
    left = counts.pop(key, 0) + by
    if left > 0:
        counts[key] = left


def stalled(ident: int | None, after_s: float | None = None) -> Reading | None:
    """The read (pid, since when, start time, owner) thread `ident` has been in for `after_s`
    (STALL_S) or longer, if any: what abandon() takes."""
    with _lock:
        reading = _reading.get(ident) if ident is not None else None
    limit = STALL_S if after_s is None else after_s
    if reading is None or monotonic() - reading[1] < limit:
        return None
    return reading


def abandon(ident: int | None, seen: Reading) -> int | None:
    """Give thread `ident` up, stalled in the read `seen` (from stalled()): quarantine the
    process it reads; its pid. None when the thread is in another read by now (or none), or
    MAX_ABANDONED threads are given up already."""
    with _lock:
        return _abandon_locked(ident, seen)


def _abandon_locked(ident: int | None, seen: Reading) -> int | None:
    if ident is None or ident in _abandoned or len(_abandoned) >= MAX_ABANDONED:
        return None
    reading = _reading.get(ident)
    if reading is None or reading is not seen:  # that read ended: this one is not stalled
        return None
    pid = reading[0]
    process = (pid, reading[2]())  # its start time: a stat read (not the process's memory)
    owner = reading[3]
    _abandoned[ident] = (process, owner)
    # the thread ends its entry, then looks for its mark, without the lock: marked first
    # and looked at again here, a read that ended meanwhile is never given up
    if _reading.get(ident) is not reading:
        del _abandoned[ident]
        return None
    _count(_quarantined, process, 1)
    _count(_quarantined_pids, pid, 1)
    _count(_stuck_owners, owner, 1)
    return pid


def log_given_up(pid: int, by: str) -> None:
    """Say that `by` gave a stuck read of process `pid` up (abandon() said so)."""
    logger.warning(
        "%s: a read of process %d's memory has not returned for %g s (a file system that "
        "does not answer under its arguments or environment): that read is given up, the "
        "process's memory is not read while it is stuck",
        by,
        pid,
        STALL_S,
    )


def at_most_abandoned() -> bool:
    """Whether MAX_ABANDONED threads are given up and still blocked: no more are."""
    with _lock:
        return len(_abandoned) >= MAX_ABANDONED


def quarantined() -> list[int]:
    """The processes whose memory is not read now."""
    with _lock:
        return sorted(_quarantined_pids)


# -- reads of threads nobody watches: made by a reader thread, waited for at most STALL_S ----


class _Job:
    __slots__ = ("begun", "done", "error", "owner", "pid", "read", "result", "started")

    def __init__(self, pid: int, read: Callable[[], Any], begun: Started, owner: int | None):
        self.pid, self.read, self.begun, self.owner = pid, read, begun, owner
        self.started = False
        self.result: Any = None
        self.error: BaseException | None = None
        self.done = threading.Event()


class _Reader:
    """A thread making reads in turn; given up when one stalls (then it ends after it)."""

    def __init__(self) -> None:
        self.jobs: queue.SimpleQueue[_Job] = queue.SimpleQueue()
        self.thread = threading.Thread(target=self._loop, name="hpcsec-proc-reader", daemon=True)
        self.thread.start()

    def _loop(self) -> None:
        ident = get_ident()
        while True:
            job = self.jobs.get()
            if _is_quarantined(job.pid, job.begun):
                job.error = Quarantined(job.pid)
            else:
                job.started = True
                _reading[ident] = (job.pid, monotonic(), job.begun, job.owner)
            if job.started:
                try:
                    job.result = job.read()
                except BaseException as exc:  # handed to the caller
                    job.error = exc
            job.done.set()
            if job.started and _done_reading(ident) is not None:
                return  # given up: a new reader took the reads queued after this one


_reader: _Reader | None = None


def _submit(job: _Job) -> _Reader:
    """The job queued on the current reader (started if none); NoReader when that reader is
    stuck and no more readers may be given up."""
    global _reader
    with _lock:
        if _reader is None:
            try:
                _reader = _Reader()
            except RuntimeError:  # no thread can be started: not read, as if none were spare
                raise NoReader(job.pid) from None
        reader = _reader
        reading = _reading.get(reader.thread.ident)  # type: ignore[arg-type]
        if (
            len(_abandoned) >= MAX_ABANDONED
            and reading is not None
            and monotonic() - reading[1] >= STALL_S
        ):
            raise NoReader(job.pid)  # refused now, not after STALL_S
    reader.jobs.put(job)
    return reader


def _by_reader(pid: int, read: Callable[[], T], started: Started, owner: int | None) -> T:
    global _reader
    job = _Job(pid, read, started, owner)
    reader = _submit(job)
    while not job.done.wait(STALL_S / 4):
        with _lock:
            ident = reader.thread.ident
            alive = reader.thread.is_alive()  # a dead reader's ident may be another's now
            reading = _reading.get(ident) if alive and ident is not None else None
            stuck = reading is not None and monotonic() - reading[1] >= STALL_S
            given_up_on = _abandon_locked(ident, reading) if stuck and reading is not None else None
            given_up = not alive or ident in _abandoned
            if given_up and _reader is reader:
                _reader = None  # the reads after this one go to a new reader
        if given_up_on is not None:
            log_given_up(given_up_on, "the /proc reader (enrichment, attribution)")
        if job.done.is_set():
            break
        if job.started and given_up:  # this read is the one stuck: its process quarantined
            raise Quarantined(pid)
        if given_up:  # queued behind a given-up read: a new reader makes it
            job = _Job(pid, read, started, owner)
            reader = _submit(job)
        elif stuck and at_most_abandoned():  # stuck, and no more readers may be given up
            raise NoReader(pid)
    if job.error is not None:
        raise job.error
    result: T = job.result
    return result

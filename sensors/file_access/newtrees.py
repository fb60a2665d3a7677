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
- every directory is opened with O_NOFOLLOW, its path read back from the descriptor and
  listed through it: a symlink in the tree is not followed, a symlink swapped in for one of
  its directories is not walked, and the marks are resolved following no symlink
  (responder.py), so nothing outside the tree can be marked by swapping one in;
- directories are charged to their owners' shares (shares.py), past which they are neither
  marked nor walked, and counted; a directory already charged (moved out and in again, or
  seen by both threads) is not charged twice;
- the queue is bounded in all and per owner (MAX_PENDING, MAX_PENDING_PER_OWNER): a user who
  makes directories in a loop fills her own part of it, not the part that walks everyone
  else's; what finds no room is counted as unwatched.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections import Counter, deque
from collections.abc import Callable

# Directories waiting to be walked, at most: in all, and of one owner.
MAX_PENDING = 4096
MAX_PENDING_PER_OWNER = 256
_OPEN_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_STOP_WAIT_S = 5.0


def open_checked(path: str) -> int | None:
    """A descriptor on the directory `path` (absolute, as the OS takes it), or None when
    `path` does not name a directory now: it is gone, a symlink, or reached through one (O_NOFOLLOW
    refuses the last name, and the path read back from the descriptor differs)."""
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


def walk_opened(
    top: str,
    descend: Callable[[str, os.DirEntry[str]], bool],
    on_dir: Callable[[str, int], None],
    on_file: Callable[[str, os.DirEntry[str]], None],
    stopping: Callable[[], bool] = lambda: False,
) -> None:
    """Walk the directory `top` (marked already): each directory below it that `descend`
    (its parent's path, its entry) takes is opened (open_checked), handed to `on_dir` (its
    path, its descriptor) before it is listed, then listed through that descriptor; each
    entry that is not a directory goes to `on_file` (its path, the entry). Symlinks are
    entries, never followed. Depth first with its own stack (no recursion limit), one
    directory open at a time."""
    stack = [top]
    while stack and not stopping():
        path = stack.pop()
        fd = open_checked(path)
        if fd is None:
            continue
        subdirs: list[str] = []
        try:
            if path != top:
                on_dir(path, fd)
            with os.scandir(fd) as entries:
                for entry in entries:
                    child = os.path.join(path, entry.name)
                    try:
                        is_dir = entry.is_dir(follow_symlinks=False)
                    except OSError:
                        continue
                    if not is_dir:
                        on_file(child, entry)
                    elif descend(path, entry):
                        subdirs.append(child)
        except OSError:  # gone while listed: what was listed is still walked
            pass
        finally:
            os.close(fd)
        stack.extend(reversed(subdirs))


class NewTrees:
    """The queue of new directories and the thread that walks them (`walk`, a path)."""

    def __init__(self, walk: Callable[[str], None], on_error: Callable[[str], None]):
        self._walk = walk
        self._on_error = on_error
        self._pending: deque[tuple[str, int]] = deque()
        self._by_owner: Counter[int] = Counter()
        self._busy = False
        self._stopping = False
        self._changed = threading.Condition()
        self._thread = threading.Thread(target=self._run, name="hpcsec-newtrees", daemon=True)
        self._thread.start()

    @property
    def stopping(self) -> bool:
        return self._stopping

    def put(self, path: str, owner: int) -> str | None:
        """Queue a directory of `owner` to be walked; why not when there is no room."""
        with self._changed:
            if self._by_owner[owner] >= MAX_PENDING_PER_OWNER:
                return f"{MAX_PENDING_PER_OWNER:,} of its owner's already wait to be walked"
            if len(self._pending) >= MAX_PENDING:
                return f"{MAX_PENDING:,} directories already wait to be walked"
            self._pending.append((path, owner))
            self._by_owner[owner] += 1
            self._changed.notify_all()
        return None

    def wait_idle(self, timeout_s: float) -> bool:
        """Whether every directory queued so far was walked within `timeout_s`."""
        with self._changed:
            return self._changed.wait_for(
                lambda: self._stopping or not (self._pending or self._busy), timeout_s
            )

    def stop(self) -> None:
        with self._changed:
            self._stopping = True
            self._pending.clear()
            self._changed.notify_all()
        self._thread.join(timeout=_STOP_WAIT_S)

    def _run(self) -> None:
        while True:
            with self._changed:
                self._busy = False
                self._changed.notify_all()
                self._changed.wait_for(lambda: self._stopping or self._pending)
                if self._stopping:
                    return
                path, owner = self._pending.popleft()
                self._by_owner[owner] -= 1
                if not self._by_owner[owner]:
                    del self._by_owner[owner]
                self._busy = True
            try:
                self._walk(path)
            except Exception as exc:  # one tree must not stop the walks of the others
                with contextlib.suppress(Exception):
                    self._on_error(f"walking {path}: {type(exc).__name__}: {exc}")

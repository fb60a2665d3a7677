"""Logging for the command line: the `hpcsec` logger, and where an unexpected error's
traceback goes.

Under systemd (the agent, the Slurm hooks) stderr is the journal: records go there from INFO
up, with the priority prefix the journal reads. At a terminal or in a pipe, stderr carries
only warnings and errors (stdout may be JSON a pipe consumes) and a crash's traceback goes to
a private file the user is pointed to, so a bug report can include it without the screen
filling with it. `--debug` puts debug records and tracebacks on stderr.
"""

from __future__ import annotations

import _thread  # a lock without importing threading
import os
import stat
import sys
from collections.abc import Mapping
from pathlib import Path

# typing.TYPE_CHECKING without importing typing (mypy reads any name TYPE_CHECKING so):
# every command imports this module, most without using typing at run time
TYPE_CHECKING = False
if TYPE_CHECKING:
    import logging
    from typing import TextIO

LOGGER_NAME = "hpcsec"
LOG_FILE_NAME = "hpcsec.log"


def under_systemd(env: Mapping[str, str]) -> bool:
    return bool(env.get("JOURNAL_STREAM") or env.get("INVOCATION_ID"))


# Commands that run as services: their progress (started, reloaded, stopping) is what an
# operator reads in their log, so it is shown from INFO even outside systemd.
SERVICE_COMMANDS = frozenset({"agent", "hub"})

# setup()'s arguments while `logging` is not imported yet (see setup); set, taken and applied
# under the lock, so two threads never apply the same one or add a handler each
_pending: tuple[bool, bool, Mapping[str, str]] | None = None
_pending_lock = _thread.allocate_lock()


def setup(debug: bool = False, env: Mapping[str, str] | None = None, service: bool = False) -> None:
    """Configure the `hpcsec` logger for one command; safe to call again (tests do).

    A command that logs nothing need not import `logging` (a tenth of a short command's
    start-up, with traceback, threading and weakref under it). So while `logging` is not
    imported, the configuration waits for the first get_logger(): every hpcsec module takes
    its logger from get_logger (tests/detector/core/test_log_lazy.py checks it), so no hpcsec
    record is ever emitted unconfigured. The last call wins.
    """
    global _pending
    env = os.environ if env is None else env
    with _pending_lock:
        _pending = (debug, under_systemd(env) or service, env)
    if "logging" in sys.modules:
        _apply_pending()


def _apply_pending() -> None:
    global _pending
    if _pending is None:
        return
    # imported before the lock is taken, and configure imports nothing: a thread holding
    # the lock never waits on an import, which may itself be waiting on the lock (a module
    # takes its logger at import)
    from hpcsec.detector.core.loghandler import configure

    with _pending_lock:  # one configuration at a time: one handler, from the last setup
        pending, _pending = _pending, None
        if pending is not None:
            debug, journal_level, env = pending
            configure(LOGGER_NAME, debug, journal_level, env)


def get_logger(name: str = LOGGER_NAME) -> logging.Logger:
    """`logging.getLogger(name)`, with setup()'s configuration applied first if it waits.

    Every hpcsec module takes its logger from here (at import, or when it first writes a
    record where it is on a short command's path and logs only on errors)."""
    import logging

    _apply_pending()
    return logging.getLogger(name)


def log_path(env: Mapping[str, str] | None = None) -> Path:
    """`$XDG_STATE_HOME/hpcsec/hpcsec.log`, by default `~/.local/state/hpcsec/hpcsec.log`.
    A relative XDG_STATE_HOME is ignored, as the XDG spec says."""
    env = os.environ if env is None else env
    base = env.get("XDG_STATE_HOME", "")
    root = Path(base) if os.path.isabs(base) else Path.home() / ".local" / "state"
    return root / "hpcsec" / LOG_FILE_NAME


def _open_private(path: Path) -> TextIO:
    """Append to `path`, a regular file only we can read, in a directory only we can enter.

    The last directory and the file are opened without following symlinks, so a link planted
    there cannot make a root process append a traceback (with its secrets) elsewhere.
    """
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    dir_fd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        if os.fstat(dir_fd).st_uid != os.geteuid():
            raise PermissionError(f"{path.parent} belongs to another user")
        os.fchmod(dir_fd, 0o700)
        flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
        fd = os.open(path.name, flags | os.O_NONBLOCK, 0o600, dir_fd=dir_fd)
    finally:
        os.close(dir_fd)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
            raise PermissionError(f"{path} is not a regular file of ours")
        os.fchmod(fd, 0o600)
        return os.fdopen(fd, "a", encoding="utf-8", errors="backslashreplace")
    except BaseException:
        os.close(fd)
        raise


def write_traceback(exc: BaseException, path: Path) -> bool:
    """Append `exc`'s traceback to the private log; False when that cannot be done."""
    import traceback  # only on a crash: see setup()

    from hpcsec.detector.core.timefmt import rfc3339  # datetime, only on a crash

    text = "".join(traceback.format_exception(exc))
    try:
        with _open_private(path) as out:
            out.write(f"--- {rfc3339()} pid {os.getpid()}: {' '.join(sys.argv)}\n{text}")
    except OSError:
        return False
    return True

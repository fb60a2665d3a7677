"""Logging for the command line: the `hpcsec` logger, and where an unexpected error's
traceback goes.

Under systemd (the agent, the Slurm hooks) stderr is the journal: records go there from INFO
up, with the priority prefix the journal reads. At a terminal or in a pipe, stderr carries
only warnings and errors (stdout may be JSON a pipe consumes) and a crash's traceback goes to
a private file the user is pointed to, so a bug report can include it without the screen
filling with it. `--debug` puts debug records and tracebacks on stderr.
"""

from __future__ import annotations

import logging
import os
import stat
import sys
import traceback
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TextIO

from hpcsec.detector.core.display import visible
from hpcsec.detector.core.timefmt import rfc3339

LOGGER_NAME = "hpcsec"
LOG_FILE_NAME = "hpcsec.log"

# Syslog priorities (sd-daemon(3) prefixes) for the journal.
_PRIORITY = {logging.DEBUG: 7, logging.INFO: 6, logging.WARNING: 4, logging.ERROR: 3}


def under_systemd(env: Mapping[str, str]) -> bool:
    return bool(env.get("JOURNAL_STREAM") or env.get("INVOCATION_ID"))


def _stderr_is_journal(env: Mapping[str, str]) -> bool:
    """JOURNAL_STREAM names the journal's socket as `dev:inode`; it is inherited, so it only
    counts when stderr is that socket (not redirected by a wrapper script)."""
    try:
        st = os.fstat(sys.stderr.fileno())
    except (OSError, ValueError, AttributeError):  # pytest's capture has no descriptor
        return False
    return env.get("JOURNAL_STREAM") == f"{st.st_dev}:{st.st_ino}"


class _StderrHandler(logging.StreamHandler):
    """Writes to the `sys.stderr` of the moment (tests and `main()` callers swap it)."""

    def __init__(self) -> None:
        super().__init__(sys.stderr)

    @property
    def stream(self) -> TextIO:
        return sys.stderr

    @stream.setter
    def stream(self, _value: TextIO) -> None:
        pass


class _VisibleFormatter(logging.Formatter):
    """Messages quote node data (paths, names, receivers' replies): their control and invisible
    characters are escaped, so a record can neither drive the terminal nor forge another
    record (a LF would start a new journal entry). A traceback keeps its own line breaks."""

    def formatMessage(self, record: logging.LogRecord) -> str:
        record.message = visible(record.message)
        return super().formatMessage(record)

    def formatException(self, ei: Any) -> str:
        return "\n".join(visible(line) for line in super().formatException(ei).splitlines())

    def formatStack(self, stack_info: str) -> str:
        return "\n".join(visible(line) for line in stack_info.splitlines())


class _JournalFormatter(_VisibleFormatter):
    def format(self, record: logging.LogRecord) -> str:
        priority = _PRIORITY.get(record.levelno, 2 if record.levelno > logging.ERROR else 6)
        return f"<{priority}>" + super().format(record)


# Commands that run as services: their progress (started, reloaded, stopping) is what an
# operator reads in their log, so it is shown from INFO even outside systemd.
SERVICE_COMMANDS = frozenset({"agent", "hub"})


def setup(
    debug: bool = False, env: Mapping[str, str] | None = None, service: bool = False
) -> logging.Logger:
    """Configure the `hpcsec` logger for one command; safe to call again (tests do)."""
    env = os.environ if env is None else env
    logger = logging.getLogger(LOGGER_NAME)
    for handler in [h for h in logger.handlers if isinstance(h, _StderrHandler)]:
        logger.removeHandler(handler)
    handler = _StderrHandler()
    text = "hpcsec: %(levelname)s: %(message)s"
    if debug:
        level = logging.DEBUG
        handler.setFormatter(_VisibleFormatter("hpcsec: %(levelname)s: %(name)s: %(message)s"))
    elif under_systemd(env) or service:
        level = logging.INFO
        journal = _stderr_is_journal(env)
        handler.setFormatter(_JournalFormatter(text) if journal else _VisibleFormatter(text))
    else:
        level = logging.WARNING
        handler.setFormatter(_VisibleFormatter(text))
    logger.setLevel(level)
    logger.addHandler(handler)
    logger.propagate = False  # a library user's root handlers must not print our records twice
    return logger


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
    text = "".join(traceback.format_exception(exc))
    try:
        with _open_private(path) as out:
            out.write(f"--- {rfc3339()} pid {os.getpid()}: {' '.join(sys.argv)}\n{text}")
    except OSError:
        return False
    return True

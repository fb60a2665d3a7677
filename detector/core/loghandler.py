"""The `hpcsec` logger's stderr handler and formatters (see core/log.py, which applies them).

Kept apart from core/log.py so that a command that logs nothing does not import `logging`
(with traceback, threading and weakref under it): log.setup() configures the logger through
this module as soon as anything imports `logging`.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Mapping
from typing import Any, TextIO

from hpcsec.detector.core.display import visible

# Syslog priorities (sd-daemon(3) prefixes) for the journal.
_PRIORITY = {logging.DEBUG: 7, logging.INFO: 6, logging.WARNING: 4, logging.ERROR: 3}


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


def _stderr_is_journal(env: Mapping[str, str]) -> bool:
    """JOURNAL_STREAM names the journal's socket as `dev:inode`; it is inherited, so it only
    counts when stderr is that socket (not redirected by a wrapper script)."""
    try:
        st = os.fstat(sys.stderr.fileno())
    except (OSError, ValueError, AttributeError):  # pytest's capture has no descriptor
        return False
    return env.get("JOURNAL_STREAM") == f"{st.st_dev}:{st.st_ino}"


def configure(name: str, debug: bool, journal_level: bool, env: Mapping[str, str]) -> None:
    """Give logger `name` one stderr handler (replacing ours from an earlier call): debug
    records and names with `debug`, INFO up in the journal's form under systemd or for a
    service (`journal_level`), else warnings and errors."""
    logger = logging.getLogger(name)
    for handler in [h for h in logger.handlers if isinstance(h, _StderrHandler)]:
        logger.removeHandler(handler)
    handler = _StderrHandler()
    text = "hpcsec: %(levelname)s: %(message)s"
    if debug:
        level = logging.DEBUG
        handler.setFormatter(_VisibleFormatter("hpcsec: %(levelname)s: %(name)s: %(message)s"))
    elif journal_level:
        level = logging.INFO
        journal = _stderr_is_journal(env)
        handler.setFormatter(_JournalFormatter(text) if journal else _VisibleFormatter(text))
    else:
        level = logging.WARNING
        handler.setFormatter(_VisibleFormatter(text))
    logger.setLevel(level)
    logger.addHandler(handler)
    logger.propagate = False  # a library user's root handlers must not print our records twice

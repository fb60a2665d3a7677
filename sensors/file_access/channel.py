"""The frames between the agent and its fanotify responder (responder.py).

One frame is one message of a SOCK_SEQPACKET socket pair, so a frame is never split and a
non-blocking send either hands over a whole frame or fails at once: the responder counts
what it could not hand over instead of waiting for the agent. This module imports only the
standard library: the responder loads nothing it does not need.

responder -> agent
  E  an access: seq, mask, pid, st_dev, st_ino, size (-1: none), drops and timeouts not
     reported yet, whether the responder holds the opener for the agent (1) or let it go
     already (0: a permission event it does not hold, or not one), then the path of the
     event's descriptor as the responder sees it
  C  counters alone (drops, timeouts), sent when no access carried them
  N  a note (a mark that failed), UTF-8
  F  fatal at start: errno, then the message; the responder exits after it
  S  the answer to a sync request (its token)
agent -> responder
  M  add a mark: flags, mask, path
  D  add a mark on what travels with the frame (a descriptor, SCM_RIGHTS) or, when the frame
     names one, on that name in the directory it is open on: flags, mask, name. The marks
     made while the watch runs are asked so, on what the agent opened and checked: no path
     is resolved again (a symlink swapped in meanwhile cannot move the mark elsewhere) and
     a mark costs the responder the same at any depth
  A  the agent is done with access `seq` (the opener may go on)
  S  sync: answered once every frame sent before it was handled
"""

from __future__ import annotations

import array
import os
import socket
import struct
from typing import NamedTuple

ACCESS = b"E"
COUNTERS = b"C"
NOTE = b"N"
FATAL = b"F"
SYNC = b"S"
MARK = b"M"
MARK_FD = b"D"
ACK = b"A"

_ACCESS = struct.Struct("<QQiQQqIIB")
_COUNTERS = struct.Struct("<II")
_FATAL = struct.Struct("<i")
_SEQ = struct.Struct("<Q")
_MARK = struct.Struct("<IQ")
MAX_FRAME = 64 * 1024  # a path is at most PATH_MAX (4 KiB); notes are cut to fit


class Access(NamedTuple):
    seq: int
    mask: int
    pid: int
    dev: int
    ino: int
    size: int | None
    dropped: int
    timeouts: int
    path: str
    held: bool = False  # the responder holds the opener until the agent is done with it


_FD_SPACE = socket.CMSG_SPACE(2 * array.array("i").itemsize)  # one expected; more is refused


def receive(sock: socket.socket) -> tuple[bytes, list[int]]:
    """One frame, without waiting (BlockingIOError when none is there), with the descriptors
    that came with it: the caller closes them. socket.recv_fds is not used: Python 3.11's
    ignores its flags (it would wait)."""
    frame, ancillary, flags, _ = sock.recvmsg(MAX_FRAME, _FD_SPACE, socket.MSG_DONTWAIT)
    fds = array.array("i")
    for level, kind, data in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(data[: len(data) - len(data) % fds.itemsize])
    if flags & socket.MSG_CTRUNC:  # more than expected: the frame is not taken whole
        for fd in fds:
            os.close(fd)
        return frame, []
    return frame, list(fds)


def pair() -> tuple[socket.socket, socket.socket]:
    return socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)


def access(
    seq: int,
    mask: int,
    pid: int,
    st: os.stat_result | None,
    path: bytes,
    counts: tuple[int, int],
    held: bool = False,
) -> bytes:
    dev, ino, size = (st.st_dev, st.st_ino, st.st_size) if st is not None else (0, 0, -1)
    return ACCESS + _ACCESS.pack(seq, mask, pid, dev, ino, size, *counts, held) + path


def counters(dropped: int, timeouts: int) -> bytes:
    return COUNTERS + _COUNTERS.pack(dropped, timeouts)


def note(text: str) -> bytes:
    return NOTE + text.encode("utf-8", "replace")[: MAX_FRAME - 1]


def fatal(err: int, text: str) -> bytes:
    return FATAL + _FATAL.pack(err) + text.encode("utf-8", "replace")[: MAX_FRAME - 8]


def seq_frame(kind: bytes, seq: int) -> bytes:
    return kind + _SEQ.pack(seq)


def mark(flags: int, mask: int, path: str, kind: bytes = MARK) -> bytes:
    """A MARK frame, or a MARK_FD one (`path`: the name in the descriptor's directory, or
    empty for the descriptor itself)."""
    return kind + _MARK.pack(flags, mask) + os.fsencode(path)


def parse_access(frame: bytes) -> Access:
    seq, mask, pid, dev, ino, size, dropped, timeouts, held = _ACCESS.unpack_from(frame, 1)
    path = os.fsdecode(frame[1 + _ACCESS.size :])
    size = None if size < 0 else size
    return Access(seq, mask, pid, dev, ino, size, dropped, timeouts, path, bool(held))


def parse_counters(frame: bytes) -> tuple[int, int]:
    dropped, timeouts = _COUNTERS.unpack_from(frame, 1)
    return dropped, timeouts


def parse_fatal(frame: bytes) -> tuple[int, str]:
    (err,) = _FATAL.unpack_from(frame, 1)
    return err, frame[1 + _FATAL.size :].decode("utf-8", "replace")


def parse_seq(frame: bytes) -> int:
    (seq,) = _SEQ.unpack_from(frame, 1)
    return seq


def parse_mark(frame: bytes) -> tuple[int, int, str]:
    flags, mask = _MARK.unpack_from(frame, 1)
    return flags, mask, os.fsdecode(frame[1 + _MARK.size :])

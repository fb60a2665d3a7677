"""The fanotify responder: a process of its own that owns the permission group and answers
every permission event FAN_ALLOW, whatever state the agent is in.

Run by the agent as `python -m hpcsec.sensors.file_access.responder SOCK_FD HOLD_S PARENT_PID`.
It shares no interpreter lock, thread or queue with the agent: a match stuck in the agent's
main thread, a stopped (SIGSTOP) or crashed agent, a full agent queue or a /proc read that
hangs cannot delay an answer by more than HOLD_S.

For each event it reads only its own descriptor table (the path of the event's descriptor)
and fstat()s that descriptor (device, inode, size), hands the access to the agent in one
non-blocking send, and then:
- holds a permission event until the agent says it is done (it reads the opener's /proc
  entry meanwhile, so a `cat` that exits right after its open is still named), but never
  longer than HOLD_S; an event that reaches HOLD_S is answered and counted, and until the
  agent answers again the responder holds nothing (a stopped agent costs one HOLD_S, not
  one per open); each access it hands over says whether it holds the opener, and the
  agent counts the opens let through unheld whose opener it then finds gone (fanwatch.py):
  with the timeouts, they are the `answer_timeout` status;
- answers at once what it could not hand over (counted as dropped), what the agent's own
  process opens, and everything past MAX_HELD events held at the same time.

It exits when the agent goes: end of file on the socket, and the parent-death signal. Its
exit closes the group, and the kernel allows every event still waiting and drops the marks.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import select
import signal
import socket
import sys
import time

from hpcsec.sensors.file_access import channel
from hpcsec.sensors.file_access import fanotify as fan

MAX_HELD = 1024  # permission events held for the agent at once; past it, answered at once
# Frames of the agent handled before the group's events are read again: a flood of marks
# (a user's new tree walked) must not keep openers waiting.
MAX_FRAMES_PER_PASS = 64
_READ_SIZE = 4096  # each event brings an open descriptor: small reads keep few open
_PR_SET_PDEATHSIG = 1
_SOCKET_BUFFER = 1 << 20  # bounds what waits for a stopped agent (about 10,000 accesses)


class Responder:
    def __init__(self, group_fd: int, sock: socket.socket, hold_s: float, parent: int):
        self.group_fd = group_fd
        self.sock = sock
        self.hold_s = hold_s
        self.skip_pids = (os.getpid(), parent)
        self.held: dict[int, tuple[int, float]] = {}  # seq -> (event fd, deadline), in order
        self.seq = 0
        self.agent_late = False  # an event reached its deadline: hold nothing until an ack
        self.dropped = 0  # not yet reported to the agent
        self.timeouts = 0

    def run(self) -> None:
        poller = select.poll()
        poller.register(self.group_fd, select.POLLIN)
        poller.register(self.sock.fileno(), select.POLLIN)
        while True:
            for fd, what in poller.poll(self._wait_ms()):
                if fd == self.group_fd:
                    self._read_group()
                elif not self._read_agent(what):
                    return
            self._expire(time.monotonic())
            if self.dropped or self.timeouts:
                self._report_counters()

    def _wait_ms(self) -> int:
        if self.dropped or self.timeouts:
            return 100  # retry reporting them
        if not self.held:
            return -1
        first_deadline = next(iter(self.held.values()))[1]
        return max(0, int((first_deadline - time.monotonic()) * 1000) + 1)

    # the kernel side
    def _read_group(self) -> None:
        try:
            buf = os.read(self.group_fd, _READ_SIZE)
        except BlockingIOError:
            return
        except OSError:
            time.sleep(0.01)  # EMFILE and the like: the kernel denies that one event itself
            return
        for event in fan.parse_events(buf):
            if event.mask & fan.FAN_Q_OVERFLOW:
                self.dropped += 1
                continue
            try:
                self._event(event)
            except Exception:  # never leave an opener waiting on a bug
                self._allow(event.fd)

    def _event(self, event: fan.RawEvent) -> None:
        permission = event.mask & fan.PERMISSION_EVENTS
        if event.pid in self.skip_pids:
            self._done(event.fd, permission)
            return
        try:
            path = os.readlink(f"/proc/self/fd/{event.fd}")
            st: os.stat_result | None = os.fstat(event.fd)
        except OSError:
            path, st = "", None
        self.seq += 1
        # decided before the send: the agent must know whether the opener waits for it (an
        # open let through unheld is one whose opener it may find gone: it counts those)
        hold = bool(permission) and not self.agent_late and len(self.held) < MAX_HELD
        counts = (self.dropped, self.timeouts)
        frame = channel.access(self.seq, event.mask, event.pid, st, os.fsencode(path), counts, hold)
        sent = self._send(frame)
        if sent:
            self.dropped = self.timeouts = 0
        else:
            self.dropped += 1
        if not permission:
            self._done(event.fd, permission)
        elif sent and hold:
            self.held[self.seq] = (event.fd, time.monotonic() + self.hold_s)
        else:
            self._allow(event.fd)

    def _done(self, event_fd: int, permission: int) -> None:
        if permission:
            self._allow(event_fd)
        elif event_fd >= 0:
            os.close(event_fd)

    def _allow(self, event_fd: int) -> None:
        if event_fd < 0:
            return
        with contextlib.suppress(OSError):
            fan.respond(self.group_fd, event_fd, allow=True)
        os.close(event_fd)

    def _expire(self, now: float) -> None:
        while self.held:
            seq, (fd, deadline) = next(iter(self.held.items()))
            if deadline > now:
                return
            del self.held[seq]
            self._allow(fd)
            self.timeouts += 1
            self.agent_late = True

    # the agent side
    def _send(self, frame: bytes) -> bool:
        try:
            self.sock.send(frame, socket.MSG_DONTWAIT)
        except (BlockingIOError, InterruptedError):
            return False
        except OSError:
            return False  # the agent is gone: end of file on our side says so next
        return True

    def _report_counters(self) -> None:
        if self._send(channel.counters(self.dropped, self.timeouts)):
            self.dropped = self.timeouts = 0

    def _read_agent(self, what: int) -> bool:
        """Handle what the agent sent, MAX_FRAMES_PER_PASS frames at most (then the group's
        events come first again); False when it is gone."""
        for _ in range(MAX_FRAMES_PER_PASS):
            try:
                frame, fds = channel.receive(self.sock)
            except (BlockingIOError, InterruptedError):
                return not what & (select.POLLHUP | select.POLLERR)
            except OSError:
                return False
            try:
                if not frame:
                    return False
                self._agent_frame(frame, fds[0] if len(fds) == 1 else -1)
            finally:
                for fd in fds:
                    os.close(fd)
        return True

    def _agent_frame(self, frame: bytes, fd: int) -> None:
        kind = frame[:1]
        if kind == channel.ACK:
            self.agent_late = False
            held = self.held.pop(channel.parse_seq(frame), None)
            if held is not None:
                self._allow(held[0])
        elif kind == channel.MARK:
            self._mark(*channel.parse_mark(frame))
        elif kind == channel.MARK_FD:
            flags, mask, name = channel.parse_mark(frame)
            if fd >= 0:
                self._mark(flags, mask, name, fd)
            else:  # at our descriptor limit (events held), the kernel dropped it
                self._send(
                    channel.note(
                        f"{name or 'a new directory'} not watched: its "
                        "descriptor did not reach the responder"
                    )
                )
        elif kind == channel.SYNC:
            self._send(frame)

    def _mark(self, flags: int, mask: int, path: str, fd: int | None = None) -> None:
        try:
            if fd is None:
                fan.mark(self.group_fd, fan.FAN_MARK_ADD | flags, mask, path)
            else:  # the descriptor itself, or a name in its directory
                fan.mark_at(self.group_fd, fan.FAN_MARK_ADD | flags, mask, fd, path or None)
        except OSError as exc:
            self._send(channel.note(f"{path or 'a new directory'} not watched: {exc.strerror}"))


def _die_with(parent: int) -> None:
    """SIGKILL when the agent dies. The signal follows the thread that started us, so end of
    file on the socket (the agent process gone) is what the loop relies on; this covers a
    loop that is not polling."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent:  # the agent died before the prctl
        sys.exit(0)


def main(argv: list[str]) -> int:
    sock_fd, hold_s, parent = int(argv[0]), float(argv[1]), int(argv[2])
    _die_with(parent)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a ^C to the agent's terminal is the agent's
    sock = socket.socket(fileno=sock_fd)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, _SOCKET_BUFFER)
    flags = fan.FAN_CLASS_CONTENT | fan.FAN_CLOEXEC | fan.FAN_NONBLOCK | fan.FAN_UNLIMITED_MARKS
    try:
        group_fd = fan.init(flags)
    except OSError as exc:
        with contextlib.suppress(OSError):
            sock.send(channel.fatal(exc.errno or errno.EIO, f"fanotify_init: {exc.strerror}"))
        return 1
    Responder(group_fd, sock, hold_s, parent).run()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""The agent's end of the fanotify responder (responder.py): starts it, asks it for marks,
tells it when an access is handled, and reads what it hands over."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time

from hpcsec.sensors.file_access import channel

HOLD_S = 0.25  # the longest the responder holds an opener for the agent's /proc read
START_TIMEOUT_S = 30.0  # the responder's start and initial marks (a large tree: many marks)
_MARK_RETRY_S = 2.0


class ResponderLink:
    def __init__(self, hold_s: float = HOLD_S):
        self.sock, theirs = channel.pair()
        try:
            self.process = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "hpcsec.sensors.file_access.responder",
                    str(theirs.fileno()),
                    str(hold_s),
                    str(os.getpid()),
                ],
                pass_fds=[theirs.fileno()],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
            )
        except BaseException:
            self.sock.close()
            raise
        finally:
            theirs.close()  # ours closed too: its end of file is the responder's signal to go
        self.sock.setblocking(False)
        self._token = 0

    @property
    def fileno(self) -> int:
        return self.sock.fileno()

    def mark(self, flags: int, mask: int, path: str, fd: int | None = None) -> bool:
        """Ask for a mark on `path`, or with `fd` on that descriptor (`path` empty) or on the
        name `path` in the directory it is open on; False if the responder does not take it
        (gone, or stopped)."""
        deadline = time.monotonic() + _MARK_RETRY_S
        if fd is None:
            frame = channel.mark(flags, mask, path)
        else:
            frame = channel.mark(flags, mask, path, channel.MARK_FD)
        while True:
            try:
                if fd is None:
                    self.sock.send(frame)
                else:
                    socket.send_fds(self.sock, [frame], [fd])
                return True
            except BlockingIOError:
                if time.monotonic() > deadline:
                    return False
                time.sleep(0.001)
            except OSError:
                return False

    def ack(self, seq: int) -> None:
        """The opener may go on. Best effort: a frame that does not fit waits for no one
        (the responder answers at its deadline anyway)."""
        with contextlib.suppress(OSError):
            self.sock.send(channel.seq_frame(channel.ACK, seq))

    def sync(self, on_frame, timeout_s: float = START_TIMEOUT_S) -> None:
        """Wait until the responder has handled every frame sent so far (its marks are in
        place); frames that arrive meanwhile go to `on_frame`. OSError if it failed."""
        self._token += 1
        token = self._token
        if not self._send(channel.seq_frame(channel.SYNC, token)):
            raise OSError("fanotify responder: not answering")
        deadline = time.monotonic() + timeout_s
        while True:
            frame = self.recv(max(0.0, deadline - time.monotonic()))
            if frame is None:
                raise OSError("fanotify responder: no answer at start")
            kind = frame[:1]
            if kind == channel.FATAL:
                err, text = channel.parse_fatal(frame)
                raise OSError(err, text)
            if kind == b"":
                raise OSError("fanotify responder: exited at start")
            if kind == channel.SYNC and channel.parse_seq(frame) == token:
                return
            on_frame(frame)

    def _send(self, frame: bytes) -> bool:
        try:
            self.sock.send(frame)
        except OSError:
            return False
        return True

    def recv(self, timeout_s: float) -> bytes | None:
        """One frame; b"" when the responder is gone; None when nothing came in time."""
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                return self.sock.recv(channel.MAX_FRAME)
            except BlockingIOError:
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                self.sock.settimeout(left)
                try:
                    return self.sock.recv(channel.MAX_FRAME)
                except TimeoutError:
                    return None
                finally:
                    self.sock.setblocking(False)
            except OSError:
                return b""

    def recv_ready(self) -> list[bytes]:
        """What is waiting now, without blocking (b"" last when the responder is gone)."""
        frames: list[bytes] = []
        while True:
            try:
                frame = self.sock.recv(channel.MAX_FRAME)
            except BlockingIOError:
                return frames
            except OSError:
                frame = b""
            frames.append(frame)
            if not frame:
                return frames

    def stop(self) -> None:
        self.sock.close()  # end of file: the responder exits, its group goes with it
        try:
            self.process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()

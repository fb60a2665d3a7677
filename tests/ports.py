"""Ports for tests that need one that nothing answers on."""

from __future__ import annotations

import socket

_HELD: list[socket.socket] = []  # bound for the rest of the run: no other test can take them


def refusing_port() -> int:
    """A TCP port on 127.0.0.1 that refuses connections: bound and never listening, and kept
    so for the rest of the test run (a port bound then released could be taken meanwhile by
    a server of another test worker, which would then answer)."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    _HELD.append(sock)
    return sock.getsockname()[1]


def bound_port() -> socket.socket:
    """A bound TCP socket on 127.0.0.1, not listening yet: connections are refused until
    the test calls `listen()` on it, on the same port."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    return sock

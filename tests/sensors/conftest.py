"""Fixtures of the sensor tests."""

from __future__ import annotations

import threading

import pytest

from hpcsec.sensors.rdma import roce


@pytest.fixture
def sniffer_open(monkeypatch) -> threading.Event:
    """Set once the RoCE sensor's packet socket is open (and filtered): what is sent after it
    is queued for the sniff, whatever the machine's load (a fixed delay was a race)."""
    opened = threading.Event()
    real = roce._listen

    def listen(*args):
        sock = real(*args)
        opened.set()
        return sock

    monkeypatch.setattr(roce, "_listen", listen)
    return opened

"""What a rule load's worker processes import to fail (test_rule_cache_files.py): kept apart
from the test module, whose imports would make each spawned worker slow to start."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path


class InWorkers(dict):
    """Thresholds that are none, read in the caller; read in a worker process, `in_worker`
    runs first (pickled to the workers with the parse's files)."""

    def __init__(self, marker: Path) -> None:
        super().__init__()
        self.parent, self.marker = os.getpid(), marker

    def __len__(self) -> int:
        if os.getpid() != self.parent:
            self.in_worker()
        return 0

    def in_worker(self) -> None:
        raise NotImplementedError


class FailsInWorkers(InWorkers):
    """A worker's parse of a group raises, after creating `marker` (so that a test knows a
    worker got that far)."""

    def in_worker(self) -> None:
        self.marker.touch()
        raise RuntimeError("read in a worker")


class SeenInWorkers(InWorkers):
    """`marker` gets a line each time a worker reads them (so that a test knows a worker is
    parsing, and how many documents it parsed); each read there takes `seconds`."""

    def __init__(self, marker: Path, seconds: float = 0.0) -> None:
        super().__init__(marker)
        self.seconds = seconds

    def in_worker(self) -> None:
        with self.marker.open("a") as marker:
            marker.write("read\n")
        time.sleep(self.seconds)


class KillsWorkers(InWorkers):
    """A worker process ends at once, in the middle of a group it has claimed, after
    creating `marker`."""

    def in_worker(self) -> None:
        self.marker.touch()
        os._exit(3)


def die_holding(claims: object) -> None:
    """A process that takes the claims' lock and is killed holding it (the OOM killer, say)."""
    claims.shared.get_lock().acquire()  # type: ignore[attr-defined]
    os.kill(os.getpid(), signal.SIGKILL)

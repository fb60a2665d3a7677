"""What a rule load's worker processes import to fail (test_rule_cache_files.py): kept apart
from the test module, whose imports would make each spawned worker slow to start."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path


class FailsInWorkers(dict):
    """Thresholds that a worker process cannot read: its parse of a group raises there, after
    creating `marker` (so that a test knows a worker got that far)."""

    def __init__(self, marker: Path) -> None:
        super().__init__()
        self.parent, self.marker = os.getpid(), marker

    def __len__(self) -> int:
        if os.getpid() != self.parent:
            self.marker.touch()
            raise RuntimeError("read in a worker")
        return 0


class SeenInWorkers(dict):
    """No thresholds, and `marker` created when a worker process reads them (so that a test
    knows a worker is parsing); each read there takes `seconds`."""

    def __init__(self, marker: Path, seconds: float = 0.0) -> None:
        super().__init__()
        self.parent, self.marker, self.seconds = os.getpid(), marker, seconds

    def __len__(self) -> int:
        if os.getpid() != self.parent:
            with self.marker.open("a") as marker:
                marker.write("read\n")  # a line per read: how many documents it parsed
            time.sleep(self.seconds)
        return 0


class KillsWorkers(dict):
    """Thresholds whose read ends a worker process at once, in the middle of a group it has
    claimed, after creating `marker`; read in the caller they are no thresholds."""

    def __init__(self, marker: Path) -> None:
        super().__init__()
        self.parent, self.marker = os.getpid(), marker

    def __len__(self) -> int:
        if os.getpid() != self.parent:
            self.marker.touch()
            os._exit(3)
        return 0


def die_holding(claims: object) -> None:
    """A process that takes the claims' lock and is killed holding it (the OOM killer, say)."""
    claims.shared.get_lock().acquire()  # type: ignore[attr-defined]
    os.kill(os.getpid(), signal.SIGKILL)

"""A real, tiny tmpfs the test can fill and free: the disk-full faults of the spool and the
store are tested on a filesystem that really says ENOSPC, not on a stub."""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest


class TinyDisk:
    def __init__(self, path: Path):
        self.path = path
        self._filler = path / "filler"

    def fill(self) -> None:
        """Take every free byte: the next write on this filesystem fails with ENOSPC."""
        fd = os.open(self._filler, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            with contextlib.suppress(OSError):
                while True:
                    os.write(fd, b"\0" * 512)
        finally:
            os.close(fd)
        with pytest.raises(OSError):
            (self.path / "probe").write_bytes(b"x" * 512)

    def free(self) -> None:
        self._filler.unlink(missing_ok=True)
        (self.path / "probe").unlink(missing_ok=True)


@contextlib.contextmanager
def tiny_disk(path: Path, size: str = "64k") -> Iterator[TinyDisk]:
    """`path` as a tmpfs of `size`, unmounted afterwards; skipped when not root."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    path.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs", str(path)], check=True
    )
    try:
        yield TinyDisk(path)
    finally:
        # lazy: a file an agent under test still holds open must not fail the teardown
        subprocess.run(["umount", "-l", str(path)], check=False)

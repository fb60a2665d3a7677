"""What a node user does to the places hpcsec writes: a shared sticky directory (like /tmp)
where alice, unprivileged, plants directories, symlinks and FIFOs before root runs hpcsec."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests import slurm_harness

as_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to act as another user")


def as_user(user: str, *argv: str) -> None:
    """Run `argv` as `user` (unprivileged), which must succeed."""
    subprocess.run(["runuser", "-u", user, "--", *argv], check=True, capture_output=True)


@contextmanager
def umask(mask: int) -> Iterator[None]:
    old = os.umask(mask)
    try:
        yield
    finally:
        os.umask(old)


@pytest.fixture
def shared() -> Iterator[Path]:
    """A world-writable sticky directory under /tmp, reachable by alice and bob."""
    slurm_harness.ensure_users()
    path = Path(tempfile.mkdtemp(prefix="hpcsec-shared-", dir="/tmp"))
    path.chmod(0o1777)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def victim(tmp_path) -> Path:
    """A file of root's that a symlink of alice's points at: it must stay as it is."""
    path = tmp_path / "victim"
    path.write_text("root's file\n")
    return path


def mode(path: Path) -> int:
    return os.lstat(path).st_mode & 0o7777


def modes_under(root: Path) -> dict[str, int]:
    """Mode of `root` and of every file and directory below it (symlinks excluded)."""
    out = {".": mode(root)}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            path = Path(dirpath) / name
            if not path.is_symlink():
                out[str(path.relative_to(root))] = mode(path)
    return out


def assert_private_tree(root: Path) -> None:
    wrong = {
        rel: f"{m:04o}"
        for rel, m in modes_under(root).items()
        if m != (0o700 if (root / rel).is_dir() else 0o600)
    }
    assert wrong == {}, f"not 0700/0600 under {root}"

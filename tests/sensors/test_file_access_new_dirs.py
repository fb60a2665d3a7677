"""Directories that appear in a protected tree while the watch runs are watched: one made
with a name that is not UTF-8, and one moved in from outside with what it holds."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest
from snapshot_builder import NodeTree
from test_file_access import (
    drain_until,
    fanotify_marks,
    responder_group,
    root_only,
    run_as,
    shared_dir,  # noqa: F401  # a fixture
    unprivileged_user,
)

from hpcsec.sensors.file_access import fanwatch
from hpcsec.sensors.file_access.records import Folder


def _marks(watch) -> int:
    return fanotify_marks(responder_group(watch.responder_pid)).count("ino")


def _wait_for_marks(watch, at_least: int) -> None:
    deadline = time.monotonic() + 10
    while _marks(watch) < at_least:
        assert time.monotonic() < deadline, f"{_marks(watch)} marks, not {at_least}"
        time.sleep(0.02)


@root_only
def test_a_directory_named_in_bytes_that_are_not_utf8_is_watched(shared_dir, tmp_path):  # noqa: F811
    user = unprivileged_user()
    watch = fanwatch.FanotifyWatch.start(
        NodeTree(tmp_path).context(), [str(shared_dir)], lambda p: True, Folder()
    )
    try:
        if watch.fid_fd < 0:
            pytest.skip("no fanotify FID mode: new directories are not reported here")
        before = _marks(watch)
        make = "import os; os.mkdir(b'bad\\xff')"
        run_as(user, ["python3", "-c", make], shared_dir)
        _wait_for_marks(watch, before + 1)  # marked by the bytes of its name
        write = "open(b'bad\\xff/w.bin', 'w').write('w')"
        run_as(user, ["python3", "-c", write], shared_dir)
        shown = f"{shared_dir}/bad\\xff/w.bin"  # event text: the byte as \xff
        records = drain_until(watch, lambda rs: any(r.path == shown for r in rs))
        assert shown in {r.path for r in records}
    finally:
        watch.stop()


@root_only
def test_a_directory_moved_in_from_outside_is_watched_with_what_it_holds(shared_dir, tmp_path):  # noqa: F811
    user = unprivileged_user()
    outside = Path(tempfile.mkdtemp(prefix="hpcsec-outside-", dir=shared_dir.parent))
    outside.chmod(0o1777)
    watch = fanwatch.FanotifyWatch.start(
        NodeTree(tmp_path).context(), [str(shared_dir)], lambda p: True, Folder()
    )
    try:
        if watch.fid_fd < 0:
            pytest.skip("no fanotify FID mode: moves are not reported here")
        run_as(user, ["sh", "-c", "mkdir -p o/sub && echo x > o/sub/f"], outside)
        before = _marks(watch)
        run_as(user, ["mv", str(outside / "o"), str(shared_dir / "moved")], outside)
        _wait_for_marks(watch, before + 3)  # o, o/sub and o/sub/f
        cat = subprocess.run(
            ["cat", str(shared_dir / "moved" / "sub" / "f")], capture_output=True, timeout=10
        )
        assert cat.stdout == b"x\n"
        wanted = str(shared_dir / "moved" / "sub" / "f")
        records = drain_until(watch, lambda rs: any(r.path == wanted for r in rs))
        assert wanted in {r.path for r in records}
    finally:
        watch.stop()
        shutil.rmtree(outside, ignore_errors=True)

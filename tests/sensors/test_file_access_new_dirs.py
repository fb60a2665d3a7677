"""A directory made in a protected tree while the watch runs is watched, also one whose name
is not UTF-8, and a symlink swapped in for it is not followed."""

from __future__ import annotations

import os
import time

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
def test_a_symlink_swapped_in_for_a_new_directory_is_not_followed(shared_dir, tmp_path):  # noqa: F811
    """A user makes a directory, then swaps a symlink to someone else's tree in for it
    before the watch marks it: nothing out there is marked."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    watch = fanwatch.FanotifyWatch.start(
        NodeTree(tmp_path / "ctx").context(), [str(shared_dir)], lambda p: True, Folder()
    )
    try:
        before = _marks(watch)
        (shared_dir / "swapped").symlink_to(elsewhere)
        watch._new_dir(str(shared_dir / "swapped"), os.statvfs(shared_dir).f_fsid)
        time.sleep(0.2)  # a mark would have reached the responder by now
        assert _marks(watch) == before
    finally:
        watch.stop()


@root_only
def test_a_protected_root_named_through_a_symlink_is_marked(shared_dir, tmp_path):  # noqa: F811
    """The operator may name the tree through a symlink (/models -> /lustre/models): the
    tree is marked, though marks never follow a symlink."""
    (shared_dir / "sub").mkdir()
    link = tmp_path / "models"
    link.symlink_to(shared_dir)
    watch = fanwatch.FanotifyWatch.start(
        NodeTree(tmp_path / "ctx").context(), [str(link)], lambda p: True, Folder()
    )
    try:
        _wait_for_marks(watch, 2)  # the tree's root and its subdirectory
    finally:
        watch.stop()

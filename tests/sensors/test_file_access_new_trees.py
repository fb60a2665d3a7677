"""Directories that appear in a protected tree while the watch runs with what they already
hold: a tree moved in from elsewhere, subdirectories made before their parent was marked
(`mkdir -p`, an untar). What lies in them is marked and indexed, on the walker's thread,
within their owners' shares, never through a symlink."""

from __future__ import annotations

import tempfile
import threading
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

from hpcsec.sensors.file_access import channel, fanwatch, newtrees
from hpcsec.sensors.file_access import fanotify as fan
from hpcsec.sensors.file_access.records import Folder


def _marks(watch) -> int:
    return fanotify_marks(responder_group(watch.responder_pid)).count("ino")


def _fid_marks(watch) -> int:
    """Inode marks of the watch's own FID group (create, delete and rename)."""
    return fanotify_marks(Path(f"/proc/self/fdinfo/{watch.fid_fd}")).count("ino")


def _settle(watch, limit_s: float = 5.0) -> int:
    """The responder's inode marks once the walker is idle and no more arrive."""
    deadline = time.monotonic() + limit_s
    last = -1
    while time.monotonic() < deadline:
        watch.new_trees.wait_idle(limit_s)
        time.sleep(0.1)  # marks sent reach the responder
        now = _marks(watch)
        if now == last:
            return now
        last = now
    return last


def _start(root: Path, ctx_dir: Path) -> fanwatch.FanotifyWatch:
    watch = fanwatch.FanotifyWatch.start(
        NodeTree(ctx_dir).context(), [str(root)], lambda p: p.startswith(str(root)), Folder()
    )
    if watch.fid_fd < 0:
        watch.stop()
        pytest.skip("no fanotify FID mode: new directories are not reported here")
    return watch


def _read_seen(watch, user, path: Path) -> set[str]:
    """Paths the watch saw when `user` reads `path` (after the walker is done)."""
    _settle(watch)
    run_as(user, ["cat", str(path)], path.parent)
    records = drain_until(watch, lambda rs: any(r.path == str(path) for r in rs))
    return {r.path for r in records}


@pytest.fixture
def outside():
    """A directory on the same filesystem as shared_dir, outside the protected tree."""
    path = Path(tempfile.mkdtemp(prefix="hpcsec-out-"))
    path.chmod(0o1777)
    yield path
    import shutil

    shutil.rmtree(path, ignore_errors=True)


@root_only
def test_subdirectories_made_with_their_parent_are_watched(shared_dir, tmp_path):  # noqa: F811
    """`mkdir -p a/b/c` makes b and c before the watch can mark a: the walker marks them,
    so a file written in c later, and a read of it, are seen."""
    user = unprivileged_user()
    watch = _start(shared_dir, tmp_path)
    try:
        make = "import os; os.makedirs('a/b/c')"
        run_as(user, ["python3", "-c", make], shared_dir)
        _settle(watch)
        weights = shared_dir / "a" / "b" / "c" / "w.bin"
        run_as(user, ["python3", "-c", f"open({str(weights)!r}, 'w').write('w')"], shared_dir)
        assert str(weights) in _read_seen(watch, user, weights)
    finally:
        watch.stop()


@root_only
def test_a_tree_moved_in_is_watched_with_its_files(shared_dir, outside, tmp_path):  # noqa: F811
    """A checkpoint written elsewhere and moved into the protected tree (one rename, no
    create event for what it holds): its files are marked and indexed, so a read of one
    is seen and named by its protected path."""
    user = unprivileged_user()
    watch = _start(shared_dir, tmp_path)
    try:
        make = "import os; os.makedirs('ckpt/shard'); open('ckpt/shard/w.bin', 'w').write('w')"
        run_as(user, ["python3", "-c", make], outside)
        run_as(user, ["mv", str(outside / "ckpt"), str(shared_dir / "ckpt")], outside)
        weights = shared_dir / "ckpt" / "shard" / "w.bin"
        assert str(weights) in _read_seen(watch, user, weights)
        st = weights.stat()
        assert watch.index.lookup(st.st_dev, st.st_ino) == str(weights)
    finally:
        watch.stop()


@root_only
def test_a_symlink_in_a_tree_moved_in_is_not_followed(shared_dir, outside, tmp_path):  # noqa: F811
    """A tree moved in holds a symlink to a directory elsewhere: nothing out there is
    marked (the walk opens each directory with O_NOFOLLOW, relative to its parent)."""
    user = unprivileged_user()
    elsewhere = tmp_path / "elsewhere"
    (elsewhere / "deep").mkdir(parents=True)
    (elsewhere / "deep" / "f").write_text("x")
    watch = _start(shared_dir, tmp_path / "ctx")
    try:
        before = _settle(watch)
        fid_before = _fid_marks(watch)
        make = f"import os; os.makedirs('t/d'); os.symlink({str(elsewhere)!r}, 't/d/esc')"
        run_as(user, ["python3", "-c", make], outside)
        run_as(user, ["mv", str(outside / "t"), str(shared_dir / "t")], outside)
        assert _settle(watch) == before + 2  # t and t/d, nothing through esc
        assert _fid_marks(watch) == fid_before + 2  # the walker's own marks: the same
        st = (elsewhere / "deep" / "f").stat()
        assert watch.index.lookup(st.st_dev, st.st_ino) is None
    finally:
        watch.stop()


@root_only
def test_a_rename_within_the_tree_is_not_charged_again(shared_dir, tmp_path):  # noqa: F811
    """Marks follow inodes: a directory renamed within the tree keeps its marks, and its
    owner's share is not charged again (a job renaming its checkpoints)."""
    user = unprivileged_user()
    run_as(user, ["python3", "-c", "import os; os.makedirs('tmp-1/x/y')"], shared_dir)
    watch = _start(shared_dir, tmp_path)
    try:
        assert watch._dir_shares.by_owner[user.pw_uid] == 3  # charged by the start's walk
        run_as(user, ["mv", "tmp-1", "step-1"], shared_dir)
        _settle(watch)
        assert watch._dir_shares.by_owner[user.pw_uid] == 3
    finally:
        watch.stop()


@root_only
def test_a_tree_moved_out_and_in_again_is_charged_once(shared_dir, outside, tmp_path):  # noqa: F811
    """A tree made while the watch runs, moved out and in again, is walked again (what was
    made in it meanwhile is marked) but its directories are charged once."""
    user = unprivileged_user()
    watch = _start(shared_dir, tmp_path)
    try:
        run_as(user, ["python3", "-c", "import os; os.makedirs('a/b')"], shared_dir)
        _settle(watch)
        assert watch._dir_shares.by_owner[user.pw_uid] == 2
        run_as(user, ["mv", str(shared_dir / "a"), str(outside / "a")], shared_dir)
        run_as(user, ["python3", "-c", "open('a/b/w.bin', 'w').write('w')"], outside)
        run_as(user, ["mv", str(outside / "a"), str(shared_dir / "a")], outside)
        weights = shared_dir / "a" / "b" / "w.bin"
        assert str(weights) in _read_seen(watch, user, weights)
        assert watch._dir_shares.by_owner[user.pw_uid] == 2
    finally:
        watch.stop()


@root_only
def test_a_walk_past_the_owners_share_counts_what_it_left(
    shared_dir,  # noqa: F811
    outside,
    tmp_path,
    monkeypatch,
):
    """A tree moved in past its owner's share: the directories past it are neither marked
    nor walked, and are counted as unwatched."""
    monkeypatch.setattr(fanwatch, "MAX_DIRS_PER_OWNER", 3)
    user = unprivileged_user()
    watch = _start(shared_dir, tmp_path)
    try:
        before = _settle(watch)
        make = "import os; [os.makedirs(f'big/{i}/{j}') for i in range(3) for j in range(2)]"
        run_as(user, ["python3", "-c", make], outside)
        run_as(user, ["mv", str(outside / "big"), str(shared_dir / "big")], outside)
        assert _settle(watch) == before + 3
        drained = watch.drain()
        assert drained.unwatched == 5, drained  # big/2, and the 2 in each of the others
        assert str(user.pw_uid) in (drained.last_unwatched or "")
    finally:
        watch.stop()


@root_only
def test_the_responder_marks_no_path_through_a_symlink(shared_dir, tmp_path):  # noqa: F811
    """A runtime mark is asked by a path read back from a descriptor; a user who swaps a
    symlink in for one of its directories before the responder resolves it gets no mark
    (the same path without the symlink is marked)."""
    elsewhere = tmp_path / "elsewhere"
    (elsewhere / "sub").mkdir(parents=True)
    watch = _start(shared_dir, tmp_path / "ctx")
    flags = fan.FAN_MARK_ONLYDIR | channel.NO_SYMLINKS
    try:
        before = _settle(watch)
        (shared_dir / "swapped").symlink_to(elsewhere)
        watch._mark(str(shared_dir / "swapped" / "sub"), fanwatch.CONTENT_MASK, flags)
        time.sleep(0.2)  # a mark would have reached the responder by now
        assert _marks(watch) == before
        assert "not watched" in (watch.drain().last_error or "")
        watch._mark(str(elsewhere / "sub"), fanwatch.CONTENT_MASK, flags)
        deadline = time.monotonic() + 5
        while _marks(watch) == before and time.monotonic() < deadline:
            time.sleep(0.02)
        assert _marks(watch) == before + 1
    finally:
        watch.stop()


def test_one_owner_fills_only_her_part_of_the_walkers_queue(monkeypatch):
    """A user making directories in a loop fills her own part of the queue; another
    owner's new directory is still queued and walked, and the refusals say why."""
    monkeypatch.setattr(newtrees, "MAX_PENDING_PER_OWNER", 3)
    monkeypatch.setattr(newtrees, "MAX_PENDING", 5)
    held = threading.Event()
    walked: list[str] = []

    def walk(path: str) -> None:
        held.wait(5)
        walked.append(path)

    trees = newtrees.NewTrees(walk, lambda why: None)
    try:
        assert trees.put("/m/first", 1001) is None  # taken by the walker, which waits
        assert trees.wait_idle(0.1) is False
        refusals = [trees.put(f"/m/u{i}", 1001) for i in range(5)]
        assert refusals[:3] == [None, None, None]
        assert refusals[3] == "3 of its owner's already wait to be walked"
        assert trees.put("/m/root-made", 0) is None
        assert trees.put("/m/other", 1002) is None
        assert trees.put("/m/third", 1003) == "5 directories already wait to be walked"
        held.set()
        assert trees.wait_idle(5)
        assert walked == ["/m/first", "/m/u0", "/m/u1", "/m/u2", "/m/root-made", "/m/other"]
    finally:
        trees.stop()


def test_a_walk_that_fails_is_reported_and_the_next_is_walked():
    errors: list[str] = []
    walked: list[str] = []

    def walk(path: str) -> None:
        if path == "/m/bad":
            raise OSError(5, "Input/output error")
        walked.append(path)

    trees = newtrees.NewTrees(walk, errors.append)
    try:
        trees.put("/m/bad", 1001)
        trees.put("/m/good", 1001)
        assert trees.wait_idle(5)
        assert walked == ["/m/good"]
        assert errors == ["walking /m/bad: OSError: [Errno 5] Input/output error"]
    finally:
        trees.stop()

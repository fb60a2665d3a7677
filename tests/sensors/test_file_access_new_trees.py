"""Directories that appear in a protected tree while the watch runs with what they already
hold: a tree moved in from elsewhere, subdirectories made before their parent was marked
(`mkdir -p`, an untar). What lies in them is marked and indexed, on the walker's thread,
within their owners' shares, never through a symlink."""

from __future__ import annotations

import dataclasses
import os
import select
import subprocess
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
from test_file_access_new_dirs import _marks

from hpcsec.sensors.file_access import channel, fanwatch, newtrees, responder
from hpcsec.sensors.file_access import fanotify as fan
from hpcsec.sensors.file_access.records import Folder
from hpcsec.sensors.file_access.shares import identity_of


def _fid_marks(watch) -> int:
    """Inode marks of the watch's own FID group (create, delete and rename)."""
    return fanotify_marks(Path(f"/proc/self/fdinfo/{watch.fid_fd}")).count("ino")


def fanotify_marks_by_inode(fdinfo: Path) -> set[int]:
    """The inodes a group's inode marks are on, as the kernel lists them (in hex)."""
    return {
        int(line.split()[1].split(":")[1], 16)
        for line in fdinfo.read_text().splitlines()
        if line.startswith("fanotify ino:")
    }


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
    marked or indexed (each directory is opened by its handle and listed through it)."""
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


def _before_5_17(monkeypatch) -> None:
    """The watch as on a kernel without FAN_RENAME: a move is reported in two halves, and
    the one into a directory does not say where it came from."""
    opened = fanwatch.FanotifyWatch._open_groups

    def without_rename(watch) -> None:
        opened(watch)
        watch.fid_mask = fanwatch.FID_MASK | fan.FAN_MOVED_FROM | fan.FAN_MOVED_TO

    monkeypatch.setattr(fanwatch.FanotifyWatch, "_open_groups", without_rename)


@root_only
def test_a_directory_swapped_for_a_symlink_while_walked_indexes_nothing_elsewhere(
    shared_dir,  # noqa: F811
    outside,
    tmp_path,
):
    """The user swaps a symlink to /etc in for a directory of her new tree while the walker
    lists it: what the walker indexes and marks is what the directory's descriptor shows (her
    files), never the files the symlink leads to under a protected name."""
    user = unprivileged_user()
    names = ["passwd", "group", "hosts"]
    make = f"import os; os.makedirs('t/d'); [open('t/d/' + n, 'w').close() for n in {names!r}]"
    run_as(user, ["python3", "-c", make], outside)
    watch = _start(shared_dir, tmp_path)
    listed = watch._new_entry
    swapped: list[str] = []

    def racing(path, entry, dir_fd):
        if not swapped:  # the window a racing user has while a big directory is listed
            swapped.append(path)
            swap = "import os; os.rename('t/d', 't/d.old'); os.symlink('/etc', 't/d')"
            run_as(user, ["python3", "-c", swap], shared_dir)
        listed(path, entry, dir_fd)

    watch._visitor = dataclasses.replace(watch._visitor, on_file=racing)
    try:
        run_as(user, ["mv", str(outside / "t"), str(shared_dir / "t")], outside)
        _settle(watch)
        assert swapped
        for name in names:
            st = os.stat(f"/etc/{name}")
            assert watch.index.lookup(st.st_dev, st.st_ino) is None
            hers = (shared_dir / "t" / "d.old" / name).stat()
            assert watch.index.lookup(hers.st_dev, hers.st_ino) == str(shared_dir / "t/d" / name)
        assert watch.index.shares.by_owner[0] == 0
    finally:
        watch.stop()


@root_only
def test_a_tree_renamed_before_its_walk_is_walked(shared_dir, outside, tmp_path):  # noqa: F811
    """A checkpoint saved to `ck.tmp` and renamed `ck` (Orbax) while its walk waits (the
    walker busy with others' trees): the walk opens the directory by its handle, wherever
    it is now, so its subdirectories are marked and a read in them is seen."""
    user = unprivileged_user()
    watch = _start(shared_dir, tmp_path)
    assert watch.new_trees is not None
    walk_on = watch.new_trees._walk_on
    release = threading.Event()

    def busy(walk, entries):
        assert release.wait(10)
        return walk_on(walk, entries)

    watch.new_trees._walk_on = busy
    try:
        # made elsewhere and moved in whole: b and c have no create event of their own
        run_as(user, ["python3", "-c", "import os; os.makedirs('ck.tmp/b/c')"], outside)
        run_as(user, ["mv", str(outside / "ck.tmp"), str(shared_dir / "ck.tmp")], outside)
        deadline = time.monotonic() + 10
        while not watch.new_trees._pending and time.monotonic() < deadline:
            time.sleep(0.02)
        assert watch.new_trees._pending  # queued, waiting
        run_as(user, ["mv", "ck.tmp", "ck"], shared_dir)
        time.sleep(0.2)  # the rename is read before the walk goes on
        release.set()
        weights = shared_dir / "ck" / "b" / "c" / "w.bin"
        _settle(watch)
        run_as(user, ["python3", "-c", f"open({str(weights)!r}, 'w').write('w')"], shared_dir)
        assert str(weights) in _read_seen(watch, user, weights)
    finally:
        release.set()
        watch.stop()


@root_only
def test_every_directory_marked_while_the_watch_runs_is_charged(
    shared_dir,  # noqa: F811
    outside,
    tmp_path,
    monkeypatch,
):
    """Her share used up by a tree she moves in, the user swaps fresh directories in for
    the ones its walk charged, between their listing and their opening: the walker opens the
    inode it charged (by its handle) or charges the one it found, so every directory the FID
    group marks is one the shares charged (or a root), and those past her share are not."""
    monkeypatch.setattr(fanwatch, "MAX_DIRS_PER_OWNER", 5)  # t and its 4
    user = unprivileged_user()
    make = "import os; [os.makedirs(f't/d{i}') for i in range(4)]"
    run_as(user, ["python3", "-c", make], outside)
    watch = _start(shared_dir, tmp_path)
    descend = watch._visitor.descend
    swapped: list[str] = []

    def racing(parent, entry):
        # the reader has not handled the fresh directories' own create events yet (left
        # out here: they would charge them, or count them as past her share, on their own)
        watch._new_dir = lambda path, fsid: None
        charged = descend(parent, entry)
        here = os.path.join(parent, entry.name)
        swap = f"import os; os.rename({here!r}, {here!r} + '.old'); os.mkdir({here!r})"
        run_as(user, ["python3", "-c", swap], shared_dir)
        swapped.append(here)
        return charged

    watch._visitor = dataclasses.replace(watch._visitor, descend=racing)
    try:
        run_as(user, ["mv", str(outside / "t"), str(shared_dir / "t")], outside)
        _settle(watch)
        assert len(swapped) == 4
        marked = fanotify_marks_by_inode(Path(f"/proc/self/fdinfo/{watch.fid_fd}"))
        dev = shared_dir.stat().st_dev
        assert all(
            (dev << 64 | ino) in watch._dir_shares.charged
            for ino in marked - {shared_dir.stat().st_ino}
        )
        assert not {os.stat(fresh).st_ino for fresh in swapped} & marked
        assert watch.drain().unwatched == 4  # the fresh ones, past her share
    finally:
        watch.stop()


@root_only
def test_a_file_made_while_a_symlink_is_swapped_in_marks_nothing_elsewhere(
    shared_dir,  # noqa: F811
    tmp_path,
    monkeypatch,
):
    """The user swaps a symlink to / in for her directory right after the watch read back
    where the create event's directory is: the file is marked and indexed by its name in
    the directory the event's handle opened, never as /etc/hostname."""
    user = unprivileged_user()
    target = os.stat("/etc/hostname")
    watch = _start(shared_dir, tmp_path)
    read_back = os.readlink
    seen: list[str] = []
    done: list[str] = []

    def racing(path, *args, **kwargs):
        # the reader reads the event's directory back twice: for the event's text, then
        # to mark the file; the user swaps right after the second
        where = read_back(path, *args, **kwargs)
        if not done and str(where).endswith("/hers/etc"):
            seen.append(str(where))
            if len(seen) == 2:
                done.append(str(where))
                swap = "import os; os.rename('hers', 'hers.old'); os.symlink('/', 'hers')"
                run_as(user, ["python3", "-c", swap], shared_dir)
        return where

    try:
        run_as(user, ["python3", "-c", "import os; os.makedirs('hers/etc')"], shared_dir)
        _settle(watch)
        monkeypatch.setattr(os, "readlink", racing)
        run_as(user, ["python3", "-c", "open('hers/etc/hostname', 'w').close()"], shared_dir)
        deadline = time.monotonic() + 10
        while not done and time.monotonic() < deadline:
            time.sleep(0.02)
        assert done
        _settle(watch)
        marked = fanotify_marks_by_inode(responder_group(watch.responder_pid))
        assert target.st_ino not in marked
        assert watch.index.lookup(target.st_dev, target.st_ino) is None
        hers = (shared_dir / "hers.old" / "etc" / "hostname").stat()
        assert hers.st_ino in marked
    finally:
        monkeypatch.undo()
        watch.stop()


@root_only
@pytest.mark.parametrize("kernel", ["5.17+", "before 5.17"])
def test_a_rename_within_the_tree_is_not_charged_again(shared_dir, tmp_path, monkeypatch, kernel):  # noqa: F811
    """Marks follow inodes: a directory renamed within the tree keeps its marks, and its
    owner's shares are not charged again (a job renaming its checkpoints), also where the
    kernel cannot say the move came from within (it is walked again, charged once)."""
    if kernel == "before 5.17":
        _before_5_17(monkeypatch)
    user = unprivileged_user()
    make = "import os; os.makedirs('tmp-1/x/y'); [open(f'tmp-1/x/y/f{i}', 'w') for i in range(5)]"
    run_as(user, ["python3", "-c", make], shared_dir)
    watch = _start(shared_dir, tmp_path)
    try:
        assert bool(watch.fid_mask & fan.FAN_RENAME) == (kernel == "5.17+")
        shares = (watch._dir_shares.by_owner, watch._file_shares.by_owner)
        assert (shares[0][user.pw_uid], shares[1][user.pw_uid]) == (3, 5)  # the start's walk
        for old, new in [("tmp-1", "step-1"), ("step-1", "tmp-1"), ("tmp-1", "step-1")]:
            run_as(user, ["mv", old, new], shared_dir)
        # events are handled in order: once the walk of a directory made after the renames
        # is over, the renames were handled
        run_as(user, ["mkdir", "step-1/probe"], shared_dir)
        deadline = time.monotonic() + 10
        while shares[0][user.pw_uid] < 4 and time.monotonic() < deadline:
            time.sleep(0.02)
        _settle(watch)
        assert (shares[0][user.pw_uid], shares[1][user.pw_uid]) == (4, 5)
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
def test_a_new_directory_is_marked_by_its_descriptor_not_its_path(shared_dir, tmp_path):  # noqa: F811
    """The marks made while the watch runs travel as the descriptor the watch opened and
    checked: a symlink swapped in for the directory's path since cannot move the mark to a
    tree elsewhere, and the mark costs the responder no path walk, however deep."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    watch = _start(shared_dir, tmp_path / "ctx")
    try:
        before = _settle(watch)
        new = shared_dir / "new"
        new.mkdir()
        fd = newtrees.open_checked(str(new))
        assert fd is not None
        try:
            (shared_dir / "new").rename(shared_dir / "old")
            (shared_dir / "new").symlink_to(elsewhere)
            watch._mark_dir(str(new), fd)
        finally:
            os.close(fd)
        deadline = time.monotonic() + 5
        while _marks(watch) == before and time.monotonic() < deadline:
            time.sleep(0.02)
        marked = fanotify_marks_by_inode(responder_group(watch.responder_pid))
        assert (shared_dir / "old").stat().st_ino in marked
        assert elsewhere.stat().st_ino not in marked
    finally:
        watch.stop()


def test_a_mark_whose_descriptor_did_not_come_through_is_told_to_the_agent():
    """At its descriptor limit (events held) the kernel drops the descriptor a mark frame
    carried: the responder tells the agent that directory is not watched."""
    ours, theirs = channel.pair()
    answering = responder.Responder(-1, theirs, 0.25, os.getpid())
    try:
        ours.send(channel.mark(0, 0, "", channel.MARK_FD))  # no descriptor with it
        assert answering._read_agent(select.POLLIN)
        note = ours.recv(channel.MAX_FRAME)
        assert note[:1] == channel.NOTE
        assert b"not watched: its descriptor did not reach the responder" in note
    finally:
        ours.close()
        theirs.close()


def test_the_responder_reads_the_groups_events_between_floods_of_marks(monkeypatch):
    """A flood of marks (a user's deep tree walked again and again) is handled
    MAX_FRAMES_PER_PASS frames at a time, the group's events read in between: openers do
    not wait behind it."""
    ours, theirs = channel.pair()
    marked: list[str] = []
    monkeypatch.setattr(
        responder.Responder, "_mark", lambda self, flags, mask, path, fd=None: marked.append(path)
    )
    answering = responder.Responder(-1, theirs, 0.25, os.getpid())
    try:
        for i in range(responder.MAX_FRAMES_PER_PASS * 2 + 5):
            ours.send(channel.mark(0, 0, f"/m/{i}"))
        assert answering._read_agent(select.POLLIN)
        assert len(marked) == responder.MAX_FRAMES_PER_PASS
        answering._read_agent(select.POLLIN)
        answering._read_agent(select.POLLIN)
        assert len(marked) == responder.MAX_FRAMES_PER_PASS * 2 + 5
    finally:
        ours.close()
        theirs.close()


def _walk(top: str, owner: int) -> newtrees.TreeWalk:
    """A walk for the queue's own tests (never opened: their walker is a stand-in)."""
    return newtrees.TreeWalk(top, owner, -1, fan.Handle(1, top.encode()), hash(top))


class _Walker:
    """A stand-in for the watch's slices: records which walk each slice was of, holds the
    first until released, and uses `per_slice` entries of a walk of `slices` slices."""

    def __init__(self, slices: dict[str, int] | None = None, per_slice: int = 1):
        self.slices = slices or {}
        self.per_slice = per_slice
        self.taken = threading.Event()
        self.release = threading.Event()
        self.walked: list[str] = []
        self.done: dict[str, int] = {}

    def __call__(self, walk: newtrees.TreeWalk, entries: int) -> int:
        self.taken.set()
        assert self.release.wait(5)
        self.walked.append(walk.top)
        self.done[walk.top] = self.done.get(walk.top, 0) + 1
        if self.done[walk.top] >= self.slices.get(walk.top, 1):
            walk.stack.clear()
        return self.per_slice


def test_one_owner_fills_only_her_part_of_the_walkers_queue(monkeypatch):
    """A user making directories in a loop fills her own part of the queue; another
    owner's new directory is still queued and walked, and the refusals say why."""
    monkeypatch.setattr(newtrees, "MAX_PENDING_PER_OWNER", 3)
    monkeypatch.setattr(newtrees, "MAX_PENDING", 6)
    walker = _Walker()
    trees = newtrees.NewTrees(walker, lambda why: None)
    try:
        assert trees.put(_walk("/m/first", 1001)) is None
        assert walker.taken.wait(5)  # the walker holds it: it waits no more
        refusals = [trees.put(_walk(f"/m/u{i}", 1001)) for i in range(4)]
        assert refusals[:3] == [None, None, None]
        assert refusals[3] == "3 of its owner's already wait to be walked"
        assert trees.put(_walk("/m/root-made", 0)) is None
        assert trees.put(_walk("/m/other", 1002)) is None  # the sixth, with the one being walked
        assert trees.put(_walk("/m/third", 1003)) == "6 directories already wait to be walked"
        walker.release.set()
        assert trees.wait_idle(5)
        # owners take turns: hers, root's, the other's, then hers again
        assert walker.walked == [
            "/m/first",
            "/m/root-made",
            "/m/other",
            "/m/u0",
            "/m/u1",
            "/m/u2",
        ]
    finally:
        walker.release.set()
        trees.stop()


def test_owners_take_turns_a_slice_each_and_a_tree_queued_twice_is_walked_once():
    """A huge tree of one user delays another's checkpoint by a slice, not by the whole
    tree; a tree moved in again before its walk began is walked once."""
    walker = _Walker(slices={"/m/huge": 3})
    trees = newtrees.NewTrees(walker, lambda why: None)
    try:
        trees.put(_walk("/m/huge", 1001))
        assert walker.taken.wait(5)
        assert trees.put(_walk("/m/ckpt", 1002)) is None
        assert trees.put(_walk("/m/ckpt", 1002)) is None  # moved out and in again meanwhile
        walker.release.set()
        assert trees.wait_idle(5)
        assert walker.walked == ["/m/huge", "/m/ckpt", "/m/huge", "/m/huge"]
    finally:
        walker.release.set()
        trees.stop()


def test_a_tree_made_then_moved_in_before_its_walk_is_walked_once_as_moved_in():
    """A directory made in the tree, moved out and in again while its walk waits: walked
    once, and as a tree moved in (its files are reported with the move's pid)."""
    walker = _Walker()
    trees = newtrees.NewTrees(walker, lambda why: None)
    try:
        trees.put(_walk("/m/busy", 1001))
        assert walker.taken.wait(5)
        made = _walk("/m/ckpt", 1002)
        moved_in = _walk("/m/ckpt", 1002)
        moved_in.arrival = (4242, "2026-11-30T10:00:00.000Z")
        assert trees.put(made) is None and trees.put(moved_in) is None
        walker.release.set()
        assert trees.wait_idle(5)
        assert walker.walked == ["/m/busy", "/m/ckpt"]
        assert made.arrival == (4242, "2026-11-30T10:00:00.000Z")
    finally:
        walker.release.set()
        trees.stop()


def test_a_directory_that_reuses_a_queued_ones_inode_number_is_queued():
    """A directory removed while its walk waits, and one made that reuses its inode number
    (ext4 does): not the same directory (another handle, with the inode's generation), so
    it is queued; the same handle queued twice is walked once."""
    walker = _Walker()
    trees = newtrees.NewTrees(walker, lambda why: None)
    try:
        trees.put(_walk("/m/busy", 1001))
        assert walker.taken.wait(5)
        gone = newtrees.TreeWalk("/m/a", 1001, -1, fan.Handle(1, b"ino-7-gen-1"), 7)
        reused = newtrees.TreeWalk("/m/b", 1001, -1, fan.Handle(1, b"ino-7-gen-2"), 7)
        again = newtrees.TreeWalk("/m/a", 1001, -1, fan.Handle(1, b"ino-7-gen-1"), 7)
        assert trees.put(gone) is None and trees.put(reused) is None
        assert trees.put(again) is None
        walker.release.set()
        assert trees.wait_idle(5)
        assert walker.walked == ["/m/busy", "/m/a", "/m/b"]
    finally:
        walker.release.set()
        trees.stop()


def test_the_walker_walks_no_faster_than_its_rate(monkeypatch):
    """Past its burst, the walker waits for its rate: a user moving a tree out and in
    again in a loop costs the node a bounded share of a core."""
    monkeypatch.setattr(newtrees, "BURST", 2 * newtrees.SLICE_ENTRIES)
    now = [0.0]
    walker = _Walker(slices={"/m/tree": 10}, per_slice=newtrees.SLICE_ENTRIES)
    walker.release.set()
    trees = newtrees.NewTrees(walker, lambda why: None, clock=lambda: now[0])
    try:
        trees.put(_walk("/m/tree", 1001))
        assert not trees.wait_idle(0.3)
        assert len(walker.walked) == 2  # the burst, then no time has passed
        now[0] += 2 * newtrees.SLICE_ENTRIES / newtrees.RATE_PER_S
        deadline = time.monotonic() + 5
        while len(walker.walked) < 4 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert not trees.wait_idle(0.3)
        assert len(walker.walked) == 4  # what the time allowed, no more
    finally:
        trees.stop()


def test_a_walk_that_fails_is_reported_and_the_next_is_walked():
    errors: list[str] = []
    walked: list[str] = []

    def walk_on(walk: newtrees.TreeWalk, entries: int) -> int:
        if walk.top == "/m/bad":
            raise OSError(5, "Input/output error")
        walked.append(walk.top)
        walk.stack.clear()
        return 1

    trees = newtrees.NewTrees(walk_on, errors.append)
    try:
        trees.put(_walk("/m/bad", 1001))
        trees.put(_walk("/m/good", 1001))
        assert trees.wait_idle(5)
        assert walked == ["/m/good"]
        assert errors == ["walking /m/bad: OSError: [Errno 5] Input/output error"]
    finally:
        trees.stop()


def _walk_whole(top: Path, visitor: newtrees.Visitor, entries: int) -> list[int]:
    """Walk `top` (its parent's filesystem: the mount descriptor) to its end in slices of
    `entries`: the entries each slice used."""
    mount_fd = os.open(top.parent, os.O_RDONLY | os.O_DIRECTORY)
    top_fd = os.open(top, os.O_RDONLY | os.O_DIRECTORY)
    try:
        handle = fan.handle_at(top_fd)
        assert handle is not None
        walk = newtrees.TreeWalk(str(top), 0, mount_fd, handle, identity_of(os.fstat(top_fd)))
        slices = []
        while not walk.over:
            slices.append(newtrees.walk_slice(walk, entries, visitor))
        return slices
    finally:
        os.close(top_fd)
        os.close(mount_fd)


@root_only
def test_a_slice_may_end_within_a_directory_and_the_next_goes_on_there(tmp_path):
    """A directory of many entries (a dataset's shard directory) is listed over several
    slices, each of the budget given, and every entry is handed over once."""
    top = tmp_path / "top"
    (top / "sub").mkdir(parents=True)
    for i in range(25):
        (top / f"f{i}").write_text("x")
        (top / "sub" / f"g{i}").write_text("x")
    files: list[str] = []
    dirs: list[str] = []
    visitor = newtrees.Visitor(
        descend=lambda parent, entry: identity_of(entry.stat(follow_symlinks=False)),
        admit=lambda path, info: False,
        in_tree=lambda path: path.startswith(str(top)),
        on_dir=lambda path, fd: dirs.append(path),
        on_file=lambda path, entry, fd: files.append(os.path.basename(path)),
        unwalked=lambda path, why: None,
    )
    slices = _walk_whole(top, visitor, 10)
    assert dirs == [str(top / "sub")]
    assert sorted(files) == sorted([f"f{i}" for i in range(25)] + [f"g{i}" for i in range(25)])
    assert max(slices) == 10 and len(slices) >= 5


@root_only
def test_a_mount_inside_a_new_tree_is_not_walked_nor_charged_and_is_counted(tmp_path):
    """A handle of the filesystem mounted inside a tree would be read as one of the tree's
    own: the walk does not cross a mount point, charges nothing for it, and says so."""
    top = tmp_path / "top"
    (top / "plain").mkdir(parents=True)
    (top / "mnt").mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "tmpfs", str(top / "mnt")], check=True)
    try:
        (top / "mnt" / "inner").mkdir()
        charged: list[str] = []
        walked: list[str] = []
        unwalked: list[tuple[str, str]] = []

        def descend(parent, entry):
            charged.append(entry.name)
            return identity_of(entry.stat(follow_symlinks=False))

        visitor = newtrees.Visitor(
            descend=descend,
            admit=lambda path, info: False,
            in_tree=lambda path: path.startswith(str(top)),
            on_dir=lambda path, fd: walked.append(path),
            on_file=lambda path, entry, fd: None,
            unwalked=lambda path, why: unwalked.append((path, why)),
        )
        _walk_whole(top, visitor, 100)
        assert charged == ["plain"] and walked == [str(top / "plain")]
        assert [path for path, _ in unwalked] == [str(top / "mnt")]
        assert "mount point" in unwalked[0][1]
    finally:
        subprocess.run(["umount", str(top / "mnt")], check=False)

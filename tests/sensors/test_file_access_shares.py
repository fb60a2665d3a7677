"""A user who can write under a protected tree makes directories and files by the thousand: the
marks and walks stay within that user's share (shares.py), and everyone else's files are
still watched."""

from __future__ import annotations

import subprocess
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

from hpcsec.sensors.file_access import fanwatch, identity, shares
from hpcsec.sensors.file_access.records import Folder
from hpcsec.sensors.file_access.shares import OwnerShares
from hpcsec.sensors.file_access.walk import walk_tree


def test_an_owner_past_its_share_is_refused_and_counted_and_others_are_not():
    owned = OwnerShares(total=5, per_owner=2)
    assert [owned.take(1000) for _ in range(4)] == [True, True, False, False]
    assert [owned.take(0) for _ in range(2)] == [True, True]
    assert owned.refusal(1000) == "its owner (uid 1000) has its share of 2"
    assert owned.take(2000) is True  # the fifth
    assert owned.take(3000) is False  # nobody gets more once all are handed out
    assert owned.refusal(3000) == "the bound of 5 in all is reached"
    assert owned.summary("directories", "not watched") == (
        "3 directories under protected paths past the bound (5 in all, 2 of one owner) are "
        "not watched (uid 1000: 2, uid 3000: 1)"
    )
    assert OwnerShares(5, 2).summary("files", "x") is None


def test_a_refused_directory_is_neither_listed_nor_walked(tmp_path: Path):
    for name in ("a", "b", "c"):
        (tmp_path / name / "deep").mkdir(parents=True)
        (tmp_path / name / "deep" / "f").write_text("x")
    walked = [d for d, _ in walk_tree(str(tmp_path), lambda entry: entry.name != "b")]
    assert sorted(walked) == sorted(
        [str(tmp_path)]
        + [str(tmp_path / n) for n in ("a", "c")]
        + [str(tmp_path / n / "deep") for n in ("a", "c")]
    )


def test_the_identity_index_walks_no_more_directories_than_one_owners_share(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setattr(identity, "MAX_DIRS_PER_OWNER", 3)
    for n in range(6):
        (tmp_path / f"d{n}").mkdir()
        (tmp_path / f"d{n}" / "w.bin").write_text("w")
    index = identity.AssetIndex([str(tmp_path)])
    index.build()
    # the root and two of its directories: three of one owner's (the test's) directories
    assert len(index.files) == 2


def ino_marks(pid: int) -> int:
    return fanotify_marks(responder_group(pid)).count("ino")


@root_only
def test_a_users_directories_use_up_that_users_share_not_the_watch(
    shared_dir,  # noqa: F811
    tmp_path,
    monkeypatch,
):
    """An unprivileged user makes 12 directories (each with a file) in a protected tree whose
    owners may each have 4 directories and 6 files marked: the user gets 4 directories, root's
    directory is still marked, an open of root's file in it is seen, the start says how many
    were refused and whose, and a directory the user makes while the watch runs is refused
    and reported."""
    monkeypatch.setattr(fanwatch, "MAX_DIRS_PER_OWNER", 4)
    monkeypatch.setattr(fanwatch, "MAX_FILES_PER_OWNER", 6)
    user = unprivileged_user()
    script = "for i in $(seq 1 12); do mkdir junk$i && echo x > junk$i/f; done"
    run_as(user, ["sh", "-c", script], shared_dir)
    legit = shared_dir / "zz-models"
    legit.mkdir()
    (legit / "w.bin").write_text("w")
    ctx = NodeTree(tmp_path).context()
    watch = fanwatch.FanotifyWatch.start(ctx, [str(shared_dir)], lambda p: True, Folder())
    try:
        # directories: root's two (the protected root, zz-models) and four of the user's;
        # files: root's w.bin and the user's four in the directories walked
        marks = ino_marks(watch.responder_pid)
        assert marks == 2 + 4 + 1 + 4
        assert [n for n in watch.notes if "past the bound" in n] == [
            f"8 directories under protected paths past the bound ({shares.MAX_DIRS:,} in all, "
            f"4 of one owner) are not watched, nor walked (files created in them are not "
            f"seen) (uid {user.pw_uid}: 8)"
        ]
        cat = subprocess.run(["cat", str(legit / "w.bin")], capture_output=True, timeout=10)
        assert cat.stdout == b"w"
        records = drain_until(watch, lambda rs: any(r.path == str(legit / "w.bin") for r in rs))
        assert str(legit / "w.bin") in {r.path for r in records}
        if watch.fid_fd < 0:
            return  # no FID mode: new directories are not reported by this kernel
        run_as(user, ["mkdir", "junk-late"], shared_dir)
        errors = []
        deadline = time.monotonic() + 10
        while not errors and time.monotonic() < deadline:
            drained = watch.drain()
            if drained.errors:
                errors.append((drained.errors, drained.last_error))
            time.sleep(0.05)
        assert errors == [
            (
                1,
                f"new directory {shared_dir / 'junk-late'} not watched: its owner "
                f"(uid {user.pw_uid}) has its share of 4",
            )
        ]
        assert ino_marks(watch.responder_pid) == marks  # no mark for it
    finally:
        watch.stop()

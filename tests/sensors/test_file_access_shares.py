"""A user who can write under a protected tree makes directories and files by the thousand: the
marks and walks stay within that user's share (shares.py), and everyone else's files are
still watched."""

from __future__ import annotations

import os
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
from hpcsec.sensors.file_access.records import Drained, Folder
from hpcsec.sensors.file_access.sensor import FileAccessSensor
from hpcsec.sensors.file_access.shares import OwnerShares
from hpcsec.sensors.file_access.walk import walk_tree
from hpcsec.sensors.subuids import Subordinates


def test_an_owner_past_its_share_is_refused_and_counted_and_others_are_not():
    owned = OwnerShares(total=5, per_owner=2)
    assert [owned.take(1000) for _ in range(4)] == [True, True, False, False]
    assert [owned.take(0) for _ in range(2)] == [True, True]
    assert owned.refusal() == "its owner (uid 1000) has its share of 2"
    assert owned.take(2000) is True  # the fifth
    assert owned.take(3000) is False  # nobody gets more once all are handed out
    assert owned.refusal() == "the bound of 5 in all is reached"
    assert owned.refusals == 3
    assert owned.summary("directories", "not watched") == (
        "3 directories under protected paths past the bound (5 in all, 2 of one owner) are "
        "not watched (uid 1000: 2, uid 3000: 1)"
    )
    assert OwnerShares(5, 2).summary("files", "x") is None


def test_a_directory_met_again_by_identity_is_charged_once():
    """What the watch meets while it runs (a tree moved out and in again, a directory both
    the reader and the walker saw) is charged once; other identities are charged anew."""
    owned = OwnerShares(total=5, per_owner=2)
    assert owned.take(1000, identity=7) and owned.take(1000, identity=7)
    assert owned.by_owner[1000] == 1
    assert owned.take(1000, identity=8) and not owned.take(1000, identity=9)
    assert owned.take(1000, identity=7)  # charged already: no share needed
    assert owned.refusals == 1 and owned.last_refused == 1000


def test_a_users_subordinate_uids_share_that_users_share():
    """Root in alice's rootless container chowns to any uid of her range: one owner."""
    ranges = Subordinates.parse("alice:100000:65536\n", "alice:x:1000:1000::/:/bin/sh\n")
    owned = OwnerShares(total=100, per_owner=3, owner_of=ranges.owner)
    assert [owned.take(uid) for uid in (1000, 100001, 100002, 100003)] == [
        True,
        True,
        True,
        False,
    ]
    assert owned.take(1001) is True
    assert owned.summary("directories", "not watched") == (
        "1 directories under protected paths past the bound (100 in all, 3 of one owner) are "
        "not watched (uid 1000: 1)"
    )


def test_past_the_bound_in_all_nothing_more_is_looked_at(tmp_path: Path):
    for n in range(5):
        (tmp_path / f"d{n}").mkdir()
    owned = OwnerShares(total=2, per_owner=10)
    walked = [d for d, _ in walk_tree(str(tmp_path), owned.take_entry)]
    assert len(walked) == 3  # the root and two directories
    assert owned.refused == {None: 3}
    assert owned.take_entry(_Unlooked(tmp_path / "d9")) is False  # no lstat: it would raise
    assert "owners not looked at, all shares handed out: 4" in (owned.summary("d", "x") or "")


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


def test_one_owners_files_do_not_crowd_the_others_out_of_the_identity_index(tmp_path: Path):
    """Mallory's thousand files use up her share of the index, not alice's place in it."""
    user = unprivileged_user()
    for n in range(12):
        (tmp_path / f"junk{n}").write_text("x")
        os.chown(tmp_path / f"junk{n}", user.pw_uid, user.pw_gid)
    (tmp_path / "zz-w.bin").write_text("w")
    os.link(tmp_path / "zz-w.bin", tmp_path / "zz-link")  # one file: counted once
    index = identity.AssetIndex([str(tmp_path)], max_files=100, max_per_owner=4)
    index.build()
    owner = os.stat(tmp_path).st_uid
    own = [p for p in index.files.values() if os.stat(p).st_uid == owner]
    assert len(own) == 1 and Path(own[0]).name in ("zz-w.bin", "zz-link")  # one inode
    assert index.shares.by_owner[owner] == 1  # taken once for its two names
    assert len(index.files) == 4 + 1
    assert index.summary() == (
        "8 protected files under protected paths past the bound (100 in all, 4 of one owner) "
        "are recognised by their path only (not through a bind mount or another hard link) "
        f"(uid {user.pw_uid}: 8)"
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
        assert watch.unwatched_notes == [
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
        refused = []
        deadline = time.monotonic() + 10
        while not refused and time.monotonic() < deadline:
            drained = watch.drain()
            if drained.unwatched:
                refused.append((drained.unwatched, drained.last_unwatched, drained.errors))
            time.sleep(0.05)
        assert refused == [
            (
                1,
                f"{shared_dir / 'junk-late'}: its owner (uid {user.pw_uid}) has its share of 4",
                0,  # not an error: a loop of them must not hide the last real one
            )
        ]
        assert ino_marks(watch.responder_pid) == marks  # no mark for it
    finally:
        watch.stop()


class _Unlooked:
    """A directory entry that must not be lstat'd."""

    def __init__(self, path: Path):
        self.path = str(path)
        self.name = path.name

    def stat(self, follow_symlinks: bool = True):
        raise AssertionError(f"{self.path} was looked at")


def _spent_users_directory(tmp_path: Path, mode: int) -> tuple[int, Path, OwnerShares]:
    """The unprivileged user's directory (with `mode`), and shares in which hers is used."""
    user = unprivileged_user()
    hers = tmp_path / "hers"
    hers.mkdir()
    os.chown(hers, user.pw_uid, user.pw_gid)
    hers.chmod(mode)
    owned = OwnerShares(total=100, per_owner=1)
    assert owned.take(user.pw_uid)
    return user.pw_uid, hers, owned


def test_what_is_in_a_spent_users_directory_is_refused_without_an_lstat(tmp_path: Path):
    """A million names in her own directory cost nothing once her share is used; root's
    (shared) directories are still looked at entry by entry."""
    uid, hers, owned = _spent_users_directory(tmp_path, 0o755)
    assert owned.take_entry(_Unlooked(hers / "d1")) is False
    assert owned.take_entry(_Unlooked(hers / "d2")) is False
    assert owned.refused == {uid: 2}
    with pytest.raises(AssertionError, match="was looked at"):
        owned.take_entry(_Unlooked(tmp_path / "shared"))  # root's: entry by entry


class _Stream:
    """A running watch that left new directories unwatched since the last drain."""

    def pending(self) -> bool:
        return True

    def drain(self) -> Drained:
        return Drained([], 0, {}, {}, 0, None, unwatched=3, last_unwatched="/m/x: why")


def test_the_sensor_reports_new_directories_left_unwatched(tmp_path: Path):
    sensor = FileAccessSensor()
    sensor._watch = _Stream()  # type: ignore[assignment]
    ctx = NodeTree(tmp_path).context(watch=[str(tmp_path)], stream=True)
    statuses = [e for e in sensor.collect(ctx) if e["event.category"] == "sensor_status"]
    assert [(e["event.action"], e["message"], e["hpcsec.errors"]) for e in statuses] == [
        (
            "unwatched",
            "3 new directories under protected paths not watched or not walked, past their "
            "owner's share or the walker's queue (last: /m/x: why)",
            3,
        )
    ]


def test_files_learned_from_their_opens_stay_within_their_owners_share(tmp_path: Path):
    """Mallory opens her refused files one by one: what the index learns of them stays in
    her share, and the index never holds more than its bound."""
    user = unprivileged_user()
    for n in range(8):
        (tmp_path / f"junk{n}").write_text("x")
        os.chown(tmp_path / f"junk{n}", user.pw_uid, user.pw_gid)
    index = identity.AssetIndex([str(tmp_path)], max_files=6, max_per_owner=2)
    index.build()
    assert len(index.files) == 2
    for n in range(8):
        st = os.stat(tmp_path / f"junk{n}")
        index.learn(st.st_dev, st.st_ino, str(tmp_path / f"junk{n}"))
        index.add_seen(str(tmp_path / f"junk{n}"), st)
    assert len(index.files) == 2  # still her two
    (tmp_path / "w.bin").write_text("w")
    st = os.stat(tmp_path / "w.bin")
    index.learn(st.st_dev, st.st_ino, str(tmp_path / "w.bin"))
    assert index.lookup(st.st_dev, st.st_ino) == str(tmp_path / "w.bin")
    # an identity the path no longer names (the file was replaced): not learned, though
    # root's share has room
    index.learn(st.st_dev, st.st_ino + 10**9, str(tmp_path / "w.bin"))
    assert len(index.files) == 3


def test_a_spent_users_shared_directory_is_looked_at_entry_by_entry(tmp_path: Path):
    """A group project's directory (group-writable, as a PI's setgid 2775): a member's
    directory in it keeps the member's own share when the PI's is used up."""
    _, project, owned = _spent_users_directory(tmp_path, 0o2775)
    with pytest.raises(AssertionError, match="was looked at"):
        owned.take_entry(_Unlooked(project / "member"))


def test_a_file_the_operator_named_is_indexed_whatever_its_owners_share(tmp_path: Path):
    user = unprivileged_user()
    hers = tmp_path / "hers"
    hers.mkdir()
    (hers / "named.bin").write_text("w")
    for path in (hers, hers / "named.bin"):
        os.chown(path, user.pw_uid, user.pw_gid)
    index = identity.AssetIndex([str(hers / "named.bin")], max_per_owner=0)
    index.build()
    assert list(index.files.values()) == [str(hers / "named.bin")]


def test_a_spent_user_making_her_directories_group_writable_gets_few_looks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """chmod g+w on her own directory must not buy a million lstats at every walk."""
    monkeypatch.setattr(shares, "MAX_LOOKS_WHEN_SPENT", 2)
    uid, hers, owned = _spent_users_directory(tmp_path, 0o775)
    for name in ("a", "b"):  # looked at: the budget
        with pytest.raises(AssertionError, match="was looked at"):
            owned.take_entry(_Unlooked(hers / name))
    assert owned.take_entry(_Unlooked(hers / "c")) is False  # then refused as hers
    assert owned.refused[uid] == 1

"""Private files and directories: what another user plants in a shared place is refused."""

from __future__ import annotations

import os
import stat

import pytest

from hpcsec.detector.core.private_fs import (
    PrivatePathError,
    make_private_dir,
    open_private,
    open_private_new,
    write_private_file,
)
from tests.hostile_fs import as_root, as_user, mode, umask


def test_directories_are_created_0700_whatever_the_umask(tmp_path):
    with umask(0o022):
        make_private_dir(tmp_path / "a" / "b" / "c")
    assert [mode(tmp_path / p) for p in ("a", "a/b", "a/b/c")] == [0o700] * 3


def test_an_existing_directory_of_ours_is_narrowed_to_0700(tmp_path):
    (tmp_path / "d").mkdir(mode=0o755)
    make_private_dir(tmp_path / "d")
    assert mode(tmp_path / "d") == 0o700


def test_a_directory_others_can_write_is_refused(tmp_path):
    (tmp_path / "d").mkdir()
    (tmp_path / "d").chmod(0o777)
    with pytest.raises(PrivatePathError, match="writable by group or others"):
        make_private_dir(tmp_path / "d")


@as_root
def test_a_directory_another_user_made_in_a_shared_place_is_refused(shared):
    as_user("alice", "mkdir", "-m", "0700", str(shared / "spool"))
    with pytest.raises(PrivatePathError, match=r"belongs to alice"):
        make_private_dir(shared / "spool")


@as_root
def test_a_symlink_to_one_of_our_directories_is_refused(shared, tmp_path):
    as_user("alice", "ln", "-s", str(tmp_path), str(shared / "spool"))
    with pytest.raises(PrivatePathError, match="symbolic link"):
        make_private_dir(shared / "spool")


@as_root
def test_a_directory_below_one_of_another_user_is_refused(shared):
    """alice could rename ours away and put hers in its place."""
    as_user("alice", "mkdir", "-m", "0755", str(shared / "hers"))
    with pytest.raises(PrivatePathError, match="belongs to alice"):
        make_private_dir(shared / "hers" / "spool")
    assert not (shared / "hers" / "spool").exists()


def test_a_world_writable_parent_that_is_not_sticky_is_refused(tmp_path):
    (tmp_path / "open").mkdir()
    (tmp_path / "open").chmod(0o777)
    with pytest.raises(PrivatePathError, match="not sticky"):
        make_private_dir(tmp_path / "open" / "spool")


@as_root
def test_a_new_file_never_writes_through_a_planted_symlink(shared, victim):
    as_user("alice", "ln", "-s", str(victim), str(shared / "out"))
    with pytest.raises(FileExistsError):
        open_private_new(shared / "out")
    with pytest.raises(OSError):  # ELOOP: not followed
        open_private(shared / "out")
    assert victim.read_text() == "root's file\n"


@as_root
def test_a_file_of_another_user_is_not_appended_to(shared):
    as_user("alice", "touch", str(shared / "alerts.jsonl"))
    with pytest.raises(PrivatePathError, match="belongs to alice"):
        open_private(shared / "alerts.jsonl")


def test_a_fifo_is_refused_without_hanging(tmp_path):
    os.mkfifo(tmp_path / "fifo")
    with pytest.raises((PrivatePathError, OSError)):
        # O_WRONLY on a FIFO without a reader: ENXIO at once thanks to O_NONBLOCK
        open_private(tmp_path / "fifo")


def test_new_files_are_0600_whatever_the_umask(tmp_path):
    with umask(0o022):
        os.close(open_private(tmp_path / "appended"))
        write_private_file(tmp_path / "replaced", b"x")
    assert mode(tmp_path / "appended") == mode(tmp_path / "replaced") == 0o600


def test_replacing_a_file_replaces_a_symlink_not_its_target(tmp_path, victim):
    (tmp_path / "meta.json").symlink_to(victim)
    write_private_file(tmp_path / "meta.json", b"{}\n")
    assert victim.read_text() == "root's file\n"
    assert stat.S_ISREG(os.lstat(tmp_path / "meta.json").st_mode)
    assert (tmp_path / "meta.json").read_bytes() == b"{}\n"

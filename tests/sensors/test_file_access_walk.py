"""The file-access sensor's tree walk (sensors/file_access/walk.py): os.walk's order and
choices, without its recursion, which a user's 1,100 nested directories under a protected
tree turned into a RecursionError at every start of the watch."""

from __future__ import annotations

import os
from pathlib import Path

from hpcsec.sensors.file_access.identity import AssetIndex
from hpcsec.sensors.file_access.walk import walk_tree


def test_the_walk_gives_what_os_walk_gives(tmp_path: Path):
    for d in ("a/b/c", "a/d", "e"):
        (tmp_path / d).mkdir(parents=True)
    for f in ("a/x.pt", "a/b/c/y.pt", "a/d/z.pt", "e/w.pt", "top.pt"):
        (tmp_path / f).write_bytes(b"w")
    (tmp_path / "a" / "to-e").symlink_to(tmp_path / "e")  # a link to a directory: a name
    (tmp_path / "a" / "to-x").symlink_to(tmp_path / "a" / "x.pt")
    expected = [
        (d, sorted(names + [n for n in dirs if os.path.islink(os.path.join(d, n))]))
        for d, dirs, names in os.walk(tmp_path)
    ]
    got = [(d, sorted(names)) for d, names in walk_tree(str(tmp_path))]
    assert sorted(got) == sorted(expected)
    assert [d for d, _ in got] == [d for d, _, _ in os.walk(tmp_path)]  # the same order


def test_a_tree_nested_deeper_than_the_recursion_limit_is_indexed(tmp_path: Path):
    # made and removed here, level by level: mkdir(parents=True) and shutil.rmtree (pytest's
    # clean-up of old temporary directories) recurse as os.walk does, and fail the same way
    levels = [str(tmp_path)]
    for _ in range(1_100):  # 2 bytes a level: well within PATH_MAX
        levels.append(os.path.join(levels[-1], "a"))
        os.mkdir(levels[-1])
    weights = os.path.join(levels[-1], "weights.pt")
    try:
        with open(weights, "wb") as fh:
            fh.write(b"w")
        index = AssetIndex([str(tmp_path)])
        index.build()
        st = os.stat(weights)
        found = index.lookup(st.st_dev, st.st_ino)
        assert found is not None and found == weights  # (the path is 2 KiB: not printed)
    finally:
        if os.path.exists(weights):
            os.remove(weights)
        for level in reversed(levels[1:]):
            os.rmdir(level)


def test_a_directory_that_cannot_be_listed_is_skipped(tmp_path: Path):
    (tmp_path / "gone").mkdir()
    walked = walk_tree(str(tmp_path))
    assert next(walked) == (str(tmp_path), [])
    (tmp_path / "gone").rmdir()  # removed between the listing and its walk
    assert list(walked) == []

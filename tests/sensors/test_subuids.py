"""A user's subordinate uids (rootless containers) count as that user (sensors/subuids.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpcsec.sensors import subuids
from hpcsec.sensors.base import FsRoot
from hpcsec.sensors.subuids import Subordinates

PASSWD = "root:x:0:0::/root:/bin/sh\nalice:x:1000:1000::/:/bin/sh\nmallory:x:1001:1001::/:/bin/sh\n"
SUBUID = "alice:100000:65536\n1001:165536:65536\nldapuser:231072:65536\n# comment\nbad:line\n"


def test_a_subordinate_uid_is_owned_by_its_user():
    ranges = Subordinates.parse(SUBUID, PASSWD)
    assert [ranges.owner(uid) for uid in (100000, 165535, 165536, 231071)] == [
        1000,
        1000,
        1001,
        1001,
    ]
    assert ranges.owner(1000) == 1000 and ranges.owner(99999) == 99999
    # a name not in the node's passwd (never asked of NSS): its range is one owner of its own
    assert ranges.owner(231072) == ranges.owner(296607) == -1
    assert ranges.owner(296608) == 296608  # past every range


def test_overlapping_ranges_and_odd_lines_are_read_without_error():
    ranges = Subordinates.parse(
        "alice:100000:65536\nbob:110000:10\ncarol:160000:10000\nx:6553\u00b2:1\n"
        "y:1:\u0661\nz:-5:10\n",
        PASSWD + "bob:x:1002:1002::/:/bin/sh\ncarol:x:1003:1003::/:/bin/sh\n",
    )
    # bob's range lies inside alice's, which starts first: hers; carol keeps the rest of hers
    assert [ranges.owner(uid) for uid in (110005, 120000, 165535, 165536, 169999)] == [
        1000,
        1000,
        1000,
        1003,
        1003,
    ]
    assert ranges.owner(6553) == 6553 and ranges.owner(1) == 1  # the odd lines: none


def test_the_node_files_are_read_through_its_etc_root_and_again_when_they_change(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setattr(subuids, "RELOAD_S", 0.0)
    subuids.forget()
    etc = FsRoot("etc", tmp_path)
    (tmp_path / "passwd").write_text(PASSWD)
    try:
        assert subuids.current(etc).owner(100001) == 100001  # no subuid file: no ranges
        (tmp_path / "subuid").write_text("alice:100000:65536\n")
        assert subuids.current(etc).owner(100001) == 1000
        (tmp_path / "subuid").write_text("mallory:100000:65536\n")  # another size, too
        assert subuids.current(etc).owner(100001) == 1001
        owners = subuids.owners(etc)  # what the file-access watch asks, as the files are now
        (tmp_path / "subuid").write_text("alice:100000:65536\n")
        assert owners(100001) == 1000
    finally:
        subuids.forget()


def test_a_cut_file_loses_its_last_line_not_a_digit(tmp_path: Path, monkeypatch):
    monkeypatch.setattr(subuids, "MAX_BYTES", 33)  # the cut falls in a count: "...:655"
    subuids.forget()
    (tmp_path / "passwd").write_text(PASSWD)
    (tmp_path / "subuid").write_text("1000:100000:65536\n1001:165536:65536\n")
    try:
        ranges = subuids.current(FsRoot("etc", tmp_path))
        assert ranges.owner(100001) == 1000
        assert ranges.owner(165537) == 165537  # "1001:165536:655" was cut off, not read
    finally:
        subuids.forget()

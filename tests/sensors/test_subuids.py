"""A user's subordinate uids (rootless containers) count as that user (sensors/subuids.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpcsec.sensors import subuids
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


def test_the_files_are_read_again_when_they_change(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    subuid, passwd = tmp_path / "subuid", tmp_path / "passwd"
    subuid.write_text("")
    passwd.write_text(PASSWD)
    monkeypatch.setattr(subuids, "SUBUID_PATH", str(subuid))
    monkeypatch.setattr(subuids, "PASSWD_PATH", str(passwd))
    monkeypatch.setattr(subuids, "RELOAD_S", 0.0)
    subuids.forget()
    try:
        assert subuids.owner_of(100001) == 100001
        subuid.write_text("alice:100000:65536\n")
        assert subuids.owner_of(100001) == 1000
        assert subuids.owner_of(None) is None
    finally:
        subuids.forget()

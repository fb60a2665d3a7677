"""The fanotify binding: event parsing on byte layouts the kernel writes, and a real group."""

from __future__ import annotations

import os
import struct
import subprocess

import pytest

from hpcsec.sensors.file_access import fanotify as fan

root_only = pytest.mark.skipif(os.geteuid() != 0, reason="fanotify needs root (CAP_SYS_ADMIN)")


def metadata(mask: int, fd: int, pid: int, info: bytes = b"") -> bytes:
    return struct.pack("<IBBHQii", 24 + len(info), 3, 0, 24, mask, fd, pid) + info


def dfid_name(info_type: int, fsid: int, handle: bytes, name: str) -> bytes:
    body = struct.pack("<Q", fsid) + struct.pack("<Ii", len(handle), 1) + handle
    body += name.encode() + b"\0"
    body += b"\0" * (-(4 + len(body)) % 4)  # records are padded to 4 bytes
    return struct.pack("<BBH", info_type, 0, 4 + len(body)) + body


def test_parses_fd_events_in_one_read():
    buf = metadata(fan.FAN_OPEN_PERM, 7, 1234) + metadata(fan.FAN_ACCESS | fan.FAN_MODIFY, 8, 99)
    assert fan.parse_events(buf) == [
        fan.RawEvent(fan.FAN_OPEN_PERM, 7, 1234),
        fan.RawEvent(fan.FAN_ACCESS | fan.FAN_MODIFY, 8, 99),
    ]


def test_parses_rename_info_records():
    info = dfid_name(fan.INFO_OLD_DFID_NAME, 42, b"\x01" * 8, "a.bin") + dfid_name(
        fan.INFO_NEW_DFID_NAME, 42, b"\x02" * 8, "b.bin"
    )
    (event,) = fan.parse_events(metadata(fan.FAN_RENAME, fan.FAN_NOFD, 55, info))
    assert event.pid == 55 and event.fd == -1
    assert [(i.info_type, i.fsid, i.handle_type, i.handle, i.name) for i in event.ids] == [
        (fan.INFO_OLD_DFID_NAME, 42, 1, b"\x01" * 8, "a.bin"),
        (fan.INFO_NEW_DFID_NAME, 42, 1, b"\x02" * 8, "b.bin"),
    ]


def test_truncated_or_foreign_version_stops_parsing():
    good = metadata(fan.FAN_ACCESS, 3, 1)
    assert fan.parse_events(good + good[:10]) == [fan.RawEvent(fan.FAN_ACCESS, 3, 1)]
    wrong_version = struct.pack("<IBBHQii", 24, 2, 0, 24, 1, 3, 1)
    assert fan.parse_events(wrong_version) == []


@root_only
def test_real_group_reports_create_with_directory_handle(tmp_path):
    if not fan.supports_fid_names():
        pytest.skip("kernel without FAN_REPORT_DFID_NAME")
    group = fan.init(fan.FAN_CLASS_NOTIF | fan.FAN_CLOEXEC | fan.FAN_REPORT_DFID_NAME)
    mount_fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fan.mark(group, fan.FAN_MARK_ADD | fan.FAN_MARK_ONLYDIR, fan.FAN_CREATE, str(tmp_path))
        child = subprocess.run(["touch", str(tmp_path / "new.txt")], check=True)
        assert child.returncode == 0
        (event,) = fan.parse_events(os.read(group, 4096))
        assert event.mask == fan.FAN_CREATE
        (fid,) = event.ids
        assert fid.info_type == fan.INFO_DFID_NAME
        assert fid.name == "new.txt"
        assert fid.fsid == os.statvfs(tmp_path).f_fsid
        assert fan.handle_path(mount_fd, fid) == str(tmp_path)
    finally:
        os.close(mount_fd)
        os.close(group)


@root_only
def test_mark_on_missing_path_names_it(tmp_path):
    group = fan.init(fan.FAN_CLASS_NOTIF | fan.FAN_CLOEXEC)
    try:
        with pytest.raises(FileNotFoundError, match=r"fanotify_mark .*/absent: No such file"):
            fan.mark(group, fan.FAN_MARK_ADD, fan.FAN_OPEN, str(tmp_path / "absent"))
    finally:
        os.close(group)

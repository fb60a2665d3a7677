"""A small ctypes binding to Linux fanotify(7): init, mark, event parsing, responses.

Only what the file-access sensor needs. Two kinds of groups exist: content groups (file
descriptors in events, permission events such as FAN_OPEN_PERM) and FID groups (file handles
plus directory entry names, which is how create/delete/rename are reported). The kernel does
not allow permission events in an FID group, hence two groups.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os
import struct
from dataclasses import dataclass
from typing import NamedTuple

from hpcsec.detector.core.text import escape_surrogates, from_node_bytes

# fanotify_init flags (include/uapi/linux/fanotify.h)
FAN_CLOEXEC = 0x1
FAN_NONBLOCK = 0x2
FAN_CLASS_NOTIF = 0x0
FAN_CLASS_CONTENT = 0x4
FAN_UNLIMITED_MARKS = 0x20
FAN_REPORT_FID = 0x200
FAN_REPORT_DIR_FID = 0x400
FAN_REPORT_NAME = 0x800
FAN_REPORT_DFID_NAME = FAN_REPORT_DIR_FID | FAN_REPORT_NAME

# event mask bits
FAN_ACCESS = 0x1
FAN_MODIFY = 0x2
FAN_CLOSE_WRITE = 0x8
FAN_CLOSE_NOWRITE = 0x10
FAN_OPEN = 0x20
FAN_MOVED_FROM = 0x40
FAN_MOVED_TO = 0x80
FAN_CREATE = 0x100
FAN_DELETE = 0x200
FAN_OPEN_EXEC = 0x1000
FAN_Q_OVERFLOW = 0x4000
FAN_OPEN_PERM = 0x10000
FAN_ACCESS_PERM = 0x20000
FAN_OPEN_EXEC_PERM = 0x40000
FAN_EVENT_ON_CHILD = 0x08000000
FAN_RENAME = 0x10000000
FAN_ONDIR = 0x40000000
PERMISSION_EVENTS = FAN_OPEN_PERM | FAN_ACCESS_PERM | FAN_OPEN_EXEC_PERM

# fanotify_mark flags
FAN_MARK_ADD = 0x1
FAN_MARK_REMOVE = 0x2
FAN_MARK_DONT_FOLLOW = 0x4
FAN_MARK_ONLYDIR = 0x8
FAN_MARK_MOUNT = 0x10
FAN_MARK_FILESYSTEM = 0x100

FAN_ALLOW = 0x1
FAN_NOFD = -1
METADATA_VERSION = 3

# info record types (FID groups)
INFO_FID = 1
INFO_DFID_NAME = 2
INFO_DFID = 3
INFO_OLD_DFID_NAME = 10
INFO_NEW_DFID_NAME = 12

AT_FDCWD = -100
O_PATH = getattr(os, "O_PATH", 0o10000000)

_METADATA = struct.Struct("<IBBHQii")  # event_len, vers, reserved, metadata_len, mask, fd, pid
_INFO_HEADER = struct.Struct("<BBH")  # info_type, pad, len
_FSID = struct.Struct("<Q")  # __kernel_fsid_t, read as one 64-bit value (as statvfs gives)
_HANDLE = struct.Struct("<Ii")  # struct file_handle: handle_bytes, handle_type
_RESPONSE = struct.Struct("<iI")  # struct fanotify_response: fd, response

_libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
_libc.fanotify_init.argtypes = [ctypes.c_uint, ctypes.c_uint]
_libc.fanotify_init.restype = ctypes.c_int
_libc.fanotify_mark.argtypes = [
    ctypes.c_int,
    ctypes.c_uint,
    ctypes.c_uint64,
    ctypes.c_int,
    ctypes.c_char_p,
]
_libc.fanotify_mark.restype = ctypes.c_int
_libc.open_by_handle_at.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_int]
_libc.open_by_handle_at.restype = ctypes.c_int
_libc.name_to_handle_at.argtypes = [
    ctypes.c_int,
    ctypes.c_char_p,
    ctypes.c_void_p,
    ctypes.c_void_p,
    ctypes.c_int,
]
_libc.name_to_handle_at.restype = ctypes.c_int


def _raise(what: str) -> None:
    err = ctypes.get_errno()
    raise OSError(err, f"{what}: {os.strerror(err)}")


def init(flags: int, event_f_flags: int = os.O_RDONLY | os.O_LARGEFILE) -> int:
    """A new fanotify group's file descriptor (OSError: EPERM without CAP_SYS_ADMIN)."""
    fd = _libc.fanotify_init(flags, event_f_flags)
    if fd < 0:
        _raise("fanotify_init")
    return fd


def mark(group_fd: int, flags: int, mask: int, path: str) -> None:
    mark_at(group_fd, flags, mask, AT_FDCWD, path)


def mark_at(group_fd: int, flags: int, mask: int, dir_fd: int, name: str | None) -> None:
    """A mark on `name` relative to the directory `dir_fd` (AT_FDCWD: the working directory),
    or with `name` None on what `dir_fd` itself is open on."""
    path = None if name is None else os.fsencode(name)
    if _libc.fanotify_mark(group_fd, flags, mask, dir_fd, path) < 0:
        _raise(f"fanotify_mark {name if name is not None else f'descriptor {dir_fd}'}")


def respond(group_fd: int, event_fd: int, allow: bool = True) -> None:
    os.write(group_fd, _RESPONSE.pack(event_fd, FAN_ALLOW if allow else 0x2))


def fd_path(event_fd: int) -> str | None:
    """The path of an event's file descriptor (our own fd table, hence the literal /proc),
    as event text: a name that is not UTF-8 keeps its bytes as `\\xNN`."""
    try:
        return escape_surrogates(os.readlink(f"/proc/self/fd/{event_fd}"))
    except OSError:
        return None


@dataclass(frozen=True)
class FileId:
    """One FID info record: the filesystem, a file handle and, for DFID_NAME, an entry name."""

    info_type: int
    fsid: int
    handle_type: int
    handle: bytes
    name: str | None  # as event text (a byte that is not UTF-8 as `\xNN`)
    os_name: str | None = None  # as the OS takes it (surrogateescape): to mark, stat, walk


class RawEvent(NamedTuple):  # a tuple: built once per kernel event, on the hot path
    mask: int
    fd: int
    pid: int
    ids: tuple[FileId, ...] = ()


def parse_events(buf: bytes) -> list[RawEvent]:
    """Split what read() returned into events (a truncated tail is ignored)."""
    events: list[RawEvent] = []
    offset, end = 0, len(buf)
    unpack = _METADATA.unpack_from
    while offset + _METADATA.size <= end:
        event_len, vers, _, meta_len, mask, fd, pid = unpack(buf, offset)
        if event_len < _METADATA.size or offset + event_len > end or vers != METADATA_VERSION:
            break
        ids: tuple[FileId, ...] = ()
        if event_len > meta_len:
            ids = _parse_info(buf, offset + meta_len, offset + event_len)
        events.append(RawEvent(mask, fd, pid, ids))
        offset += event_len
    return events


def _parse_info(buf: bytes, offset: int, end: int) -> tuple[FileId, ...]:
    out = []
    while offset + _INFO_HEADER.size <= end:
        info_type, _, length = _INFO_HEADER.unpack_from(buf, offset)
        if length < _INFO_HEADER.size or offset + length > end:
            break
        if info_type in (
            INFO_FID,
            INFO_DFID,
            INFO_DFID_NAME,
            INFO_OLD_DFID_NAME,
            INFO_NEW_DFID_NAME,
        ):
            pos = offset + _INFO_HEADER.size
            (fsid,) = _FSID.unpack_from(buf, pos)
            handle_bytes, handle_type = _HANDLE.unpack_from(buf, pos + _FSID.size)
            start = pos + _FSID.size + _HANDLE.size
            handle = bytes(buf[start : start + handle_bytes])
            name = os_name = None
            if info_type in (INFO_DFID_NAME, INFO_OLD_DFID_NAME, INFO_NEW_DFID_NAME):
                raw = bytes(buf[start + handle_bytes : offset + length]).split(b"\0", 1)[0]
                name, os_name = from_node_bytes(raw), os.fsdecode(raw)
            out.append(FileId(info_type, fsid, handle_type, handle, name, os_name))
        offset += length
    return tuple(out)


class Handle(NamedTuple):
    """A file handle (name_to_handle_at): names one inode of its filesystem, whatever it is
    called or where it is moved, never another that reuses the inode number later."""

    handle_type: int
    handle: bytes


_MAX_HANDLE_SZ = 128
AT_EMPTY_PATH = 0x1000


def handle_at(dir_fd: int, name: str = "") -> Handle | None:
    """The handle of `name` in the directory `dir_fd` (not followed if a symlink), or of what
    `dir_fd` is open on with no name (None: gone, or its filesystem gives none)."""
    buf = ctypes.create_string_buffer(_HANDLE.size + _MAX_HANDLE_SZ)
    _HANDLE.pack_into(buf, 0, _MAX_HANDLE_SZ, 0)
    mount_id = ctypes.c_int()
    flags = 0 if name else AT_EMPTY_PATH
    if _libc.name_to_handle_at(dir_fd, os.fsencode(name), buf, ctypes.byref(mount_id), flags) < 0:
        return None
    size, handle_type = _HANDLE.unpack_from(buf, 0)
    return Handle(handle_type, buf.raw[_HANDLE.size : _HANDLE.size + size])


def open_handle(mount_fd: int, handle: Handle | FileId, flags: int = O_PATH) -> int:
    """A descriptor on the inode a handle names (OSError: gone, or not openable so), opened
    through a descriptor on the same filesystem; no path is resolved."""
    header = _HANDLE.pack(len(handle.handle), handle.handle_type) + handle.handle
    buf = ctypes.create_string_buffer(header, len(header))
    fd = _libc.open_by_handle_at(mount_fd, ctypes.addressof(buf), flags | os.O_CLOEXEC)
    if fd < 0:
        _raise("open_by_handle_at")
    return fd


def handle_path(mount_fd: int, file_id: FileId, as_text: bool = True) -> str | None:
    """Resolve a file handle to a path through a descriptor on the same filesystem: as event
    text, or (`as_text` False) as the OS takes it, to mark, stat or walk."""
    try:
        fd = open_handle(mount_fd, file_id)
    except OSError:
        return None
    try:
        if as_text:
            return fd_path(fd)
        try:
            return os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            return None
    finally:
        os.close(fd)


def supports_fid_names() -> bool:
    """Whether this kernel gives directory handles and names (FAN_REPORT_DFID_NAME, 5.9+)."""
    try:
        fd = init(FAN_CLASS_NOTIF | FAN_CLOEXEC | FAN_REPORT_DFID_NAME)
    except OSError:
        return False
    os.close(fd)
    return True


@functools.cache  # a handful of distinct masks occur; this runs once per kernel event
def actions_of(mask: int) -> tuple[str, ...]:
    out = []
    if mask & (FAN_OPEN_PERM | FAN_OPEN):
        out.append("open")
    if mask & (FAN_OPEN_EXEC_PERM | FAN_OPEN_EXEC):
        out.append("exec")
    if mask & FAN_ACCESS:
        out.append("read")
    if mask & FAN_MODIFY:
        out.append("write")
    if mask & FAN_CLOSE_WRITE:
        out.append("close_write")
    return tuple(out)

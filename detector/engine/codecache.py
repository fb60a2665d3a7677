"""The generated match code of a category, compiled once: its code object kept in hpcsec's
private cache directory (core/cachedir.py), named by a hash of its source.

Python's compiler was a third of what compiling SigmaHQ's categories cost at every start of
`scan` or the agent (0.8 s for `windows_process_creation` alone), and reading the same code
object back with marshal takes 0.016 s. The source is generated anew at every start (from
the rules, the filters and the placeholders, so it is exactly what they make), and only its
compilation is taken from the cache: an entry can only ever stand for the source it was
compiled from. The name covers the source, the file name the code reports and Python's
bytecode version; an entry holds a SHA-256 of its marshalled code before it, checked before
the code is read, so a damaged entry is compiled again rather than run.

A code object runs whatever it says, so entries live where the rule cache's pickles do: a
directory only this user can write, every entry opened without following links. At most
MAX_ENTRIES are kept; past that, the least recently used go.
"""

from __future__ import annotations

import contextlib
import hashlib
import marshal
import os
import sys
from importlib.util import MAGIC_NUMBER
from pathlib import Path
from types import CodeType

from hpcsec.detector.core.cachedir import open_private_dir, read_entry_at, write_entry_at

PREFIX = "code-"
FORMAT = b"hpcsec-code-1\n"
MAX_ENTRIES = 512  # SigmaHQ's rules make about 140 a rule set
_DIGEST = hashlib.sha256().digest_size


def entry_name(source: str, filename: str) -> str:
    digest = hashlib.sha256(FORMAT + MAGIC_NUMBER + sys.version.encode())
    digest.update(filename.encode("utf-8", "surrogatepass") + b"\0")
    digest.update(source.encode("utf-8", "surrogatepass"))
    return PREFIX + digest.hexdigest()


def compiled(source: str, filename: str, directory: Path | None) -> CodeType:
    """`compile(source, filename, "exec")`, read from the cache in `directory` when it holds
    it, else compiled and stored there; compiled alone when `directory` is None or is not
    a private directory of ours."""
    fd = open_private_dir(directory, create=True) if directory is not None else None
    if fd is None:
        return compile(source, filename, "exec")
    try:
        name = entry_name(source, filename)
        code = _decode(read_entry_at(fd, name))
        if code is not None:
            with contextlib.suppress(OSError):  # used now: the last to be pruned
                os.utime(name, dir_fd=fd, follow_symlinks=False)
            return code
        code = compile(source, filename, "exec")
        payload = marshal.dumps(code)
        if write_entry_at(fd, name, [hashlib.sha256(payload).digest(), payload]):
            _prune(fd)
        return code
    finally:
        os.close(fd)


def _decode(data: bytes | None) -> CodeType | None:
    if data is None or len(data) < _DIGEST:
        return None
    payload = memoryview(data)[_DIGEST:]
    if hashlib.sha256(payload).digest() != data[:_DIGEST]:
        return None
    try:
        code = marshal.loads(payload)
    except (ValueError, EOFError, TypeError):
        return None
    return code if isinstance(code, CodeType) else None


def _prune(fd: int) -> None:
    """The least recently used entries beyond MAX_ENTRIES removed."""
    try:
        names = [name for name in os.listdir(fd) if name.startswith(PREFIX)]
    except OSError:
        return
    if len(names) <= MAX_ENTRIES:
        return
    used = []
    for name in names:
        with contextlib.suppress(OSError):
            used.append((os.stat(name, dir_fd=fd, follow_symlinks=False).st_mtime_ns, name))
    for _, name in sorted(used)[: len(used) - MAX_ENTRIES]:
        with contextlib.suppress(OSError):
            os.unlink(name, dir_fd=fd)

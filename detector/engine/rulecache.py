"""Loaded rules cached on disk, one entry per rule file, so the agent's start and SIGHUP reload
skip the YAML and pySigma parse of every file that did not change (most of their load time).

An entry holds what one rule file gave: its rules and its errors. It is keyed by a SHA-256 of
everything that result depends on: the file's path and bytes, the threshold values, the
hpcsec version and the code that parses rules (each source file's identity on disk, see
code_state: a reinstall or a copy of the same code is a miss, an edit is never a hit), Python's
and pySigma's versions (`fingerprint`). Any change is a new key; a load reads the entries of
the files that did not change and parses only the others (loader.py). What is decided across
files (duplicate ids, correlation references, test events) is not cached: it runs over the
assembled set at every load (crossfile.py).

The entries of one load live in one pack file, named after the paths the rules were loaded
from (`pack_name`: the files under them may come and go, the pack stays), rewritten whole
after a load that parsed any file: a file per entry cost a load of SigmaHQ's 3,754 files
0.3 to 2.9 s of kernel time to create them (ext4 on a 2-core VM), against 0.05 s to write
one 21 MB pack of them all (bench/rule_load.py). A pack holds the entries its last load used
and the latest SPARE_ENTRIES of those of files changed or gone since (an edit may be undone);
beyond MAX_PACKS packs (other rule paths), the least recently used are removed, and so are
the one-file-per-entry files of earlier hpcsec versions (OLD_ENTRY_PREFIX).

Entries are pickles, so only the user who runs hpcsec may be able to write them: the cache is
`$XDG_CACHE_HOME/hpcsec` (else `~/.cache/hpcsec`), created 0700; it is used only when it is a
real directory (not a symlink) owned by this user with no access for others, and every pack
is opened relative to that directory's descriptor with O_NOFOLLOW, so a path swapped after the
check is not followed. A pack whose index cannot be read counts as empty, an entry that cannot
be read or unpickled as missing: the files are parsed again and the pack rewritten.

An entry holds, per rule, its header (ruleset.RuleHeader: plain values) and its pySigma object
pickled on its own, unpickled only when the rule is first used (LoadedRule.sigma): reading an
entry costs the headers, and `rules list` or `config check` never import pySigma's parser. So
that damage found late cannot pass for a rule, the entry carries a SHA-256 of its contents,
checked before anything in it is used.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import pickle
import struct
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

# the private directory is shared with the site config cache (core/cachedir.py)
from hpcsec.detector.core.cachedir import default_dir as default_dir
from hpcsec.detector.core.cachedir import installed_version as installed_version
from hpcsec.detector.core.cachedir import open_private_dir as _open_private
from hpcsec.detector.core.cachedir import read_entry_at, remove_entry_at, write_entry_at
from hpcsec.detector.core.errors import RuleError, location
from hpcsec.detector.engine.ruleset import LoadedRule, RuleHeader, RuleSet

FORMAT = b"hpcsec-rulecache-4"
# the code whose output is cached: a change to it must not read an old entry
CODE_DIRS = (Path(__file__).parent, Path(__file__).parent.parent / "core")
# a code file changed this recently is identified by its bytes as well (code_state)
RACY_NS = 3_000_000_000
# entries of files changed or no longer loaded that a pack keeps (the latest)
SPARE_ENTRIES = 64
MAX_PACKS = 16  # rule paths whose pack is kept: the least recently used beyond are removed
PACK_FORMAT = b"hpcsec-rulepack-1\n"
# what names a pack, and what named an entry of earlier versions (one file each): pruning
# removes only those (the directory is shared with other caches of hpcsec)
PACK_PREFIX = "rulepack-"
OLD_ENTRY_PREFIX = "rules-"
_COUNT = struct.Struct("<I")  # a pack's number of entries
_RECORD = struct.Struct("<HI")  # per entry: its key's length, then its length

# names a correlation rule refers to (its `rules`, the rules of an extended condition, its
# aliases' rules), kept beside its header so that references are checked without pySigma
References = tuple[Any, ...]


# One rule file's rules (lazy: header and pickled object) and errors, in file order; the
# functional form, as ruleset.RuleHeader (typing compiles a class body's string annotations).
FileEntry = NamedTuple(  # noqa: UP014 (see above)
    "FileEntry",
    [("ruleset", RuleSet), ("references", list[References])],  # one reference per rule
)


def fingerprint(code_dirs: Sequence[Path] = CODE_DIRS) -> bytes | None:
    """What every entry depends on besides its file: versions and the parsing code (None when
    the code cannot be read: no caching)."""
    digest = hashlib.sha256(FORMAT)
    for name in ("hpcsec", "pySigma"):
        digest.update(f"{name} {installed_version(name)}\n".encode())
    digest.update(sys.version.encode())
    now = time.time_ns()
    try:
        for directory in code_dirs:
            for name in sorted(os.listdir(directory)):
                if name.endswith(".py"):
                    digest.update(code_state(os.path.join(directory, name), now))
    except OSError:
        return None
    return digest.digest()


def code_state(path: str, now_ns: int) -> bytes:
    """What identifies one code file's contents, without reading it: its path, device, inode,
    size, mtime and ctime. Writing to a file sets both times, putting the mtime back sets the
    ctime (which only the clock sets), and replacing a file gives a new inode: an edit changes
    this. On a file system whose clock ticks coarsely, an edit within the same tick as the
    last one keeps the times, so a file changed less than RACY_NS ago is identified by its
    bytes too (git's racy-clean check)."""
    info = os.stat(path)
    state = (
        f"{path}\0{info.st_dev} {info.st_ino} {info.st_size} "
        f"{info.st_mtime_ns} {info.st_ctime_ns}\n".encode()
    )
    if now_ns - max(info.st_mtime_ns, info.st_ctime_ns) < RACY_NS:
        with open(path, "rb") as code:
            state += hashlib.sha256(code.read()).digest()
    return state


def file_key(
    fingerprint: bytes, path: Path, data: bytes, threshold_values: Mapping[str, Any] | None
) -> str:
    """The entry name of one rule file read as `data` with these thresholds."""
    digest = hashlib.sha256(fingerprint)
    digest.update(repr(sorted((threshold_values or {}).items())).encode())
    digest.update(f"\0{path}\0{len(data)}\0".encode())
    digest.update(data)
    return digest.hexdigest()


def pack_name(roots: Sequence[str | Path]) -> str:
    """The pack of a load of the rules under `roots` (the files and directories it was given,
    in any order and spelling)."""
    digest = hashlib.sha256(PACK_FORMAT)
    for root in sorted({os.fsencode(os.path.abspath(root)) for root in roots}):
        digest.update(root + b"\0")
    return PACK_PREFIX + digest.hexdigest()


# A pack's entries by key, each a view of the bytes read (copied by decode_stored).
Pack = dict[str, memoryview]


class CacheDir:
    """The cache directory, opened (and checked) once for the many entries of one load."""

    def __init__(self, directory: Path, create: bool):
        self.fd = _open_private(directory, create)

    def __enter__(self) -> CacheDir:
        return self

    def __exit__(self, *_: object) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None

    def read_pack(self, name: str) -> Pack:
        """The entries of the pack `name`; empty when absent, not ours, or its index is
        damaged."""
        data = None if self.fd is None else read_entry_at(self.fd, name)
        return unpack(data) if data is not None else {}

    def write_pack(self, name: str, entries: Mapping[str, bytes | memoryview]) -> bool:
        """Store a pack of `entries` atomically: a reader sees the old pack or the whole of
        the new one."""
        index = [_COUNT.pack(len(entries))]
        for key, entry in entries.items():
            encoded = key.encode("ascii")
            index += (_RECORD.pack(len(encoded), len(entry)), encoded)
        parts = [PACK_FORMAT, *index, *entries.values()]
        return self.fd is not None and write_entry_at(self.fd, name, parts)

    def touch(self, name: str) -> None:
        """Mark the pack `name` used now, for pruning (its mtime)."""
        if self.fd is not None:
            with contextlib.suppress(OSError):
                os.utime(name, dir_fd=self.fd, follow_symlinks=False)

    def prune(self, current: str) -> None:
        """Remove the least recently used packs beyond MAX_PACKS, never `current`, and the
        entry files of earlier versions (dot names are writes in progress)."""
        if self.fd is None:
            return
        try:
            names = os.listdir(self.fd)
        except OSError:
            return
        aged = []
        for name in names:
            if name.startswith(OLD_ENTRY_PREFIX):
                remove_entry_at(self.fd, name)
            elif name.startswith(PACK_PREFIX) and name != current:
                with contextlib.suppress(OSError):
                    info = os.stat(name, dir_fd=self.fd, follow_symlinks=False)
                    aged.append((info.st_mtime_ns, name))
        for _, name in sorted(aged)[: max(0, len(aged) + 1 - MAX_PACKS)]:
            remove_entry_at(self.fd, name)


def unpack(data: bytes) -> Pack:
    """The entries of a pack's bytes by key; empty when its format or index does not hold
    (the entries themselves are checked as they are decoded: decode_stored)."""
    if not data.startswith(PACK_FORMAT):
        return {}
    view = memoryview(data)
    try:
        at = len(PACK_FORMAT)
        (count,) = _COUNT.unpack_from(view, at)
        at += _COUNT.size
        records = []
        for _ in range(count):
            key_length, length = _RECORD.unpack_from(view, at)
            at += _RECORD.size
            key = bytes(view[at : at + key_length]).decode("ascii")
            at += key_length
            records.append((key, length))
    except (struct.error, UnicodeDecodeError):
        return {}
    entries: Pack = {}
    for key, length in records:
        entries[key] = view[at : at + length]
        at += length
    if at != len(data):  # cut short, or bytes beyond what the index says
        return {}
    return entries


def decode_stored(entry: bytes | memoryview) -> FileEntry | None:
    """A stored entry; None when it cannot be one (damaged: the file is parsed again)."""
    try:
        return decode_entry(entry)
    except Exception:  # any unpickling or shape error of bytes damaged on disk
        return None


def read_all(fd: int, size: int) -> bytes:
    """The bytes of an open file (os.read: a file object per entry costs a warm load of
    thousands of files more than reading them does)."""
    data = os.read(fd, size + 1)
    if len(data) <= size:
        return data
    chunks = [data]  # the file grew since its fstat
    while chunk := os.read(fd, 65536):
        chunks.append(chunk)
    return b"".join(chunks)


def read_file(path: Path) -> bytes | None:
    """A rule file's bytes, None when it cannot be read (its parse says why)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        return read_all(fd, os.fstat(fd).st_size)
    except OSError:
        return None
    finally:
        os.close(fd)


def read(directory: Path, roots: Sequence[str | Path]) -> dict[str, RuleSet | None]:
    """The rule sets of the pack of `roots` by key (None where an entry is damaged)."""
    with CacheDir(directory, create=False) as cache:
        pack = cache.read_pack(pack_name(roots))
    return {
        key: (entry.ruleset if (entry := decode_stored(data)) is not None else None)
        for key, data in pack.items()
    }


def _error_tuple(error: RuleError) -> tuple[str, str | None, int | None, int | None]:
    where = error.location
    if where is None:
        return error.message, None, None, None
    return error.message, where.path, where.line, where.column


def encode(ruleset: RuleSet, references: Sequence[References] | None = None) -> bytes:
    """An entry of `ruleset`'s rules and errors (`references`: one per rule, () when none)."""
    return encode_entry(ruleset, references)[0]


def encode_entry(
    ruleset: RuleSet, references: Sequence[References] | None = None
) -> tuple[bytes, FileEntry]:
    """`encode`, and the entry as decode_entry reads it back, made without unpickling it:
    each rule's pySigma object stays in the bytes just pickled until first used, as a cached
    rule's does."""
    refs = list(references) if references is not None else [()] * len(ruleset.rules)
    rules = [
        (tuple(r.header), r.blob(), r.path, r.line, r.vector, r.origin, tuple(ref))
        for r, ref in zip(ruleset.rules, refs, strict=True)
    ]
    contents = (rules, ruleset.tests, ruleset.files, [_error_tuple(e) for e in ruleset.errors])
    payload = pickle.dumps(contents, protocol=pickle.HIGHEST_PROTOCOL)
    digest = hashlib.sha256(payload).digest()
    data = pickle.dumps((FORMAT, digest, payload), protocol=pickle.HIGHEST_PROTOCOL)
    return data, _entry_of(*contents)


def decode(data: bytes) -> RuleSet | None:
    """The rule set of an entry; None when it is not one (wrong format, checksum or shape)."""
    entry = decode_entry(data)
    return entry.ruleset if entry is not None else None


def decode_entry(data: bytes | memoryview) -> FileEntry | None:
    outer = pickle.loads(data)
    if not (isinstance(outer, tuple) and len(outer) == 3 and outer[0] == FORMAT):
        return None
    _, digest, payload = outer
    # a checksum against damage, not a secret: a plain comparison will do
    if not isinstance(payload, bytes) or hashlib.sha256(payload).digest() != digest:
        return None
    rules, tests, files, errors = pickle.loads(payload)
    for header, blob, *_ in rules:
        if len(header) != len(RuleHeader._fields) or not isinstance(blob, bytes):
            return None
    return _entry_of(rules, tests, files, errors)


def _entry_of(
    rules: Sequence[tuple[Any, ...]],
    tests: Sequence[Any],
    files: Sequence[str],
    errors: Sequence[tuple[str, str | None, int | None, int | None]],
) -> FileEntry:
    ruleset = RuleSet(tests=list(tests), files=list(files))
    references: list[References] = []
    for header, blob, path, line, vector, origin, refs in rules:
        ruleset.rules.append(
            LoadedRule.cached(RuleHeader(*header), blob, path, line, vector, origin)
        )
        references.append(tuple(refs))
    for message, path, line, column in errors:
        ruleset.errors.append(RuleError(message, location(path, line, column)))
    return FileEntry(ruleset, references)

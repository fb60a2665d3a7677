"""Loaded rule sets cached on disk, so the agent's start and SIGHUP reload skip the YAML and
pySigma parse of thousands of rules (most of their load time).

An entry is keyed by a SHA-256 of everything the loaded set depends on: each rule file's path
and bytes, the threshold values, whether test events were read, the hpcsec version and the
source of the code that parses rules, Python's and pySigma's versions. Any change is a new key;
old entries are simply not read again.

Entries are pickles, so only the user who runs hpcsec may be able to write them: the cache is
`$XDG_CACHE_HOME/hpcsec` (else `~/.cache/hpcsec`), created 0700; it is used only when it is a
real directory (not a symlink) owned by this user with no access for others, and every entry
is opened relative to that directory's descriptor with O_NOFOLLOW, so a path swapped after the
check is not followed. An entry that cannot be read or unpickled is removed and rebuilt.

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
import stat
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

# the private directory is shared with the site config cache (core/cachedir.py)
from hpcsec.detector.core.cachedir import default_dir as default_dir
from hpcsec.detector.core.cachedir import installed_version as installed_version
from hpcsec.detector.core.cachedir import open_private_dir as _open_private
from hpcsec.detector.engine.ruleset import LoadedRule, RuleHeader, RuleSet

FORMAT = b"hpcsec-rulecache-2"
# the code whose output is cached: a change to it must not read an old entry
CODE_DIRS = (Path(__file__).parent, Path(__file__).parent.parent / "core")


def cache_key(
    files: Sequence[Path], threshold_values: Mapping[str, Any] | None, with_tests: bool
) -> str | None:
    """The entry name for these inputs; None when a file cannot be read (no caching)."""
    digest = hashlib.sha256(FORMAT)
    for name in ("hpcsec", "pySigma"):
        digest.update(f"{name} {installed_version(name)}\n".encode())
    digest.update(sys.version.encode())
    digest.update(repr(sorted((threshold_values or {}).items())).encode())
    digest.update(b"tests" if with_tests else b"no tests")
    try:
        for code in sorted(p for d in CODE_DIRS for p in d.glob("*.py")):
            digest.update(code.read_bytes())
        for file in files:
            data = file.read_bytes()
            digest.update(f"\0{file}\0{len(data)}\0".encode())
            digest.update(data)
    except OSError:
        return None
    return digest.hexdigest()


def read(directory: Path, key: str) -> RuleSet | None:
    fd = _open_private(directory, create=False)
    if fd is None:
        return None
    try:
        try:
            entry = os.open(key, os.O_RDONLY | os.O_NOFOLLOW, dir_fd=fd)
        except OSError:
            return None
        with os.fdopen(entry, "rb") as f:
            info = os.fstat(f.fileno())
            if not stat.S_ISREG(info.st_mode) or info.st_uid != os.geteuid():
                return None
            data = f.read()
        try:
            ruleset = decode(data)
        except Exception:  # a corrupt entry: any unpickling or shape error; rebuilt by the caller
            ruleset = None
        if ruleset is None:
            _remove(key, fd)
        return ruleset
    finally:
        os.close(fd)


def encode(ruleset: RuleSet) -> bytes:
    rules = [(tuple(r.header), r.blob(), r.path, r.line, r.vector, r.origin) for r in ruleset.rules]
    payload = pickle.dumps((rules, ruleset.tests, ruleset.files), protocol=pickle.HIGHEST_PROTOCOL)
    digest = hashlib.sha256(payload).digest()
    return pickle.dumps((FORMAT, digest, payload), protocol=pickle.HIGHEST_PROTOCOL)


def decode(data: bytes) -> RuleSet | None:
    """The rule set of an entry; None when it is not one (wrong format, checksum or shape)."""
    outer = pickle.loads(data)
    if not (isinstance(outer, tuple) and len(outer) == 3 and outer[0] == FORMAT):
        return None
    _, digest, payload = outer
    # a checksum against damage, not a secret: a plain comparison will do
    if not isinstance(payload, bytes) or hashlib.sha256(payload).digest() != digest:
        return None
    rules, tests, files = pickle.loads(payload)
    ruleset = RuleSet(tests=list(tests), files=list(files))
    for header, blob, path, line, vector, origin in rules:
        if len(header) != len(RuleHeader._fields) or not isinstance(blob, bytes):
            return None
        ruleset.rules.append(
            LoadedRule.cached(RuleHeader(*header), blob, path, line, vector, origin)
        )
    return ruleset


def write(directory: Path, key: str, ruleset: RuleSet) -> RuleSet | None:
    """Store the entry (atomically: a reader sees the old state or the whole entry); a cache
    that cannot be written only costs the next load its time. Returns the rule set as the
    entry holds it (lazy rules, see the module's docstring), None when it was not written."""
    fd = _open_private(directory, create=True)
    if fd is None:
        return None
    temporary = f".{key}.{os.getpid()}"
    try:
        data = encode(ruleset)
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
        with os.fdopen(os.open(temporary, flags, 0o600, dir_fd=fd), "wb") as f:
            f.write(data)
        os.replace(temporary, key, src_dir_fd=fd, dst_dir_fd=fd)
    except (OSError, pickle.PicklingError, RecursionError, TypeError, AttributeError):
        _remove(temporary, fd)
        return None
    finally:
        os.close(fd)
    return decode(data)


def _remove(name: str, fd: int) -> None:
    with contextlib.suppress(OSError):
        os.unlink(name, dir_fd=fd)

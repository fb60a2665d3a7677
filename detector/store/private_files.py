"""The store's files on disk: the DuckDB database and Parquet exports, private and ours.

DuckDB creates its files itself, following symlinks and with the process umask, and it
refuses a database file we create empty beforehand. So a new file is made by DuckDB in a
private (0700) directory of its own beside the target, narrowed to 0600 there, and then
hard-linked (database: never replacing anything) or renamed (export: replacing the name
itself, never writing through a symlink planted there) into place. What sits at the name
already must be a regular file of ours.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

from hpcsec.detector.core.errors import HpcsecError
from hpcsec.detector.core.private_fs import FILE_MODE


class StoreFileError(HpcsecError):
    """A store or export path that is not a regular file of ours."""


def check_own_file(path: str | Path) -> None:
    """Refuse `path` unless it is a regular file (not a symlink) owned by us; narrow a wider
    mode to 0600."""
    st = os.lstat(path)
    if not stat.S_ISREG(st.st_mode):
        raise StoreFileError(f"refusing {path}: it is not a regular file")
    if st.st_uid != os.geteuid():
        raise StoreFileError(f"refusing {path}: it belongs to uid {st.st_uid}, not to us")
    if stat.S_IMODE(st.st_mode) & 0o077:
        os.chmod(path, FILE_MODE, follow_symlinks=False)


@contextlib.contextmanager
def _private_workdir(target: Path) -> Iterator[Path]:
    """A new 0700 directory beside `target` (same filesystem, so link and rename work)."""
    work = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent or "."))
    try:
        yield work
    finally:
        shutil.rmtree(work, ignore_errors=True)


def create_private_db(path: str | Path, initialise: Callable[[str], None]) -> None:
    """Have `initialise(tmp_path)` create the database, then put it at `path` as a 0600 file
    of ours. Does nothing when `path` exists and is a regular file of ours."""
    target = Path(path)
    if os.path.lexists(target):
        check_own_file(target)
        return
    with _private_workdir(target) as work:
        tmp = work / target.name
        initialise(str(tmp))
        os.chmod(tmp, FILE_MODE)
        try:
            os.link(tmp, target)  # never replaces: made meanwhile, it is checked below
        except FileExistsError:
            check_own_file(target)


def export_privately(path: str | Path, write: Callable[[str], None]) -> None:
    """Have `write(tmp_path)` write the export, then rename it to `path` as a 0600 file."""
    target = Path(path)
    if os.path.lexists(target) and not os.path.islink(target):
        check_own_file(target)  # replacing another user's file would hand it to us silently
    with _private_workdir(target) as work:
        tmp = work / target.name
        write(str(tmp))
        os.chmod(tmp, FILE_MODE)
        os.replace(tmp, target)

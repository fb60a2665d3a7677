"""Protected files by identity: (st_dev, st_ino) -> the file's canonical path.

The marks fire for a protected file whatever path opened it (inode marks), but the path the
opener used may be anything: a bind mount (also one made in a user namespace, invisible
from ours), another mount of the same filesystem, a hard link, a symlink, `..`. The index
maps the identity the responder read with fstat() back to the path the file has under the
protected roots, so site policy and rules see the asset, not the disguise.

Built by walking the roots at start, completed as files are created or renamed under them,
and rebuilt every REBUILD_S (a file replaced by another keeps its path, not its inode).
Bounded per owner and in all (shares.py): past its owner's share a file is matched by path
only, and a note says so; the walk visits the directories the watch marks, no more.
"""

from __future__ import annotations

import os
import stat
import threading
import time
from collections.abc import Callable

from hpcsec.detector.core.text import escape_surrogates
from hpcsec.sensors.file_access.shares import (
    MAX_DIRS,
    MAX_DIRS_PER_OWNER,
    MAX_INDEXED,
    MAX_INDEXED_PER_OWNER,
    OwnerShares,
)
from hpcsec.sensors.file_access.walk import walk_tree

REBUILD_S = 300.0


class AssetIndex:
    def __init__(
        self,
        roots: list[str],
        max_files: int = MAX_INDEXED,
        max_per_owner: int = MAX_INDEXED_PER_OWNER,
        owner_of: Callable[[int], int] = int,
    ):
        self.roots = roots
        self.max_files = max_files
        self.max_per_owner = max_per_owner
        self.owner_of = owner_of  # a uid's owner: itself, or its subordinate range's user
        self.files: dict[tuple[int, int], str] = {}
        self.shares = self._shares()  # of the files indexed
        self.built_at = 0.0
        # added to by the watch's reader thread and its new trees' walker, rebuilt by the
        # sensor's: the lock keeps the shares and the map in step (never held for a walk)
        self._lock = threading.Lock()

    @property
    def truncated(self) -> bool:
        """Whether files were left out (past their owner's share, or all of them)."""
        return bool(self.shares.refused)

    def summary(self) -> str | None:
        return self.shares.summary(
            "protected files",
            "recognised by their path only (not through a bind mount or another hard link)",
        )

    def build(self) -> None:
        files: dict[tuple[int, int], str] = {}
        shares = self._shares()
        directories = OwnerShares(MAX_DIRS, MAX_DIRS_PER_OWNER, self.owner_of)
        for root in self.roots:
            for path in _regular_files(root, directories):
                if shares.full and path != root:  # no more can be indexed: the walk is over
                    shares.refuse_unlooked()
                    break
                self._add(files, shares, path, named=path == root)
        with self._lock:
            self.files, self.shares = files, shares
        self.built_at = time.monotonic()

    def _shares(self) -> OwnerShares:
        return OwnerShares(self.max_files, self.max_per_owner, self.owner_of)

    def rebuild_if_due(self) -> None:
        if time.monotonic() - self.built_at >= REBUILD_S:
            self.build()

    def add_seen(self, path: str, st: os.stat_result) -> None:
        """A file created, renamed or found under a root while the watch runs, with the
        lstat its directory's descriptor gave: the path is not resolved again (a directory
        of it swapped for a symlink since would index a file elsewhere under a protected
        name)."""
        with self._lock:
            if not self.shares.full:
                self._add(self.files, self.shares, path, st=st)

    def learn(self, dev: int, ino: int, path: str) -> None:
        """A protected file seen by its path before the index had it: within its owner's
        share, when the path still names that file."""
        if not dev or self.shares.full or (dev, ino) in self.files:
            return
        try:
            st = os.lstat(path)
        except OSError:
            return
        with self._lock:
            if (st.st_dev, st.st_ino) == (dev, ino) and self.shares.take(st.st_uid):
                self.files[(dev, ino)] = escape_surrogates(path)

    def lookup(self, dev: int, ino: int) -> str | None:
        return self.files.get((dev, ino))

    @staticmethod
    def _add(
        files: dict[tuple[int, int], str],
        shares: OwnerShares,
        path: str,
        named: bool = False,
        st: os.stat_result | None = None,
    ) -> None:
        """Index one file within its owner's share; a file the operator `named` as a root is
        indexed whatever its owner's share (and counted in it). `st`: its lstat, if made."""
        if not named and shares.spent_in(os.path.dirname(path)):
            return
        if st is None:
            try:
                st = os.lstat(path)
            except OSError:
                return
        identity = (st.st_dev, st.st_ino)
        # the first path of a hard-linked file, which counts once in its owner's share
        new = stat.S_ISREG(st.st_mode) and identity not in files
        if new and (shares.take(st.st_uid) or named):
            files[identity] = escape_surrogates(path)  # as event text, as the asset path


def _regular_files(root: str, shares: OwnerShares):
    """The files under `root`, through the directories the shares allow: the directories
    the watch marks (fanwatch.py), so that a user's million directories cost a rebuild no
    more than they cost the marks."""
    if not os.path.isdir(root):
        yield root
        return
    shares.take_path(root)
    # symlinks are not followed: they are not assets
    for dirpath, names in walk_tree(root, shares.take_entry):
        for name in names:
            yield os.path.join(dirpath, name)

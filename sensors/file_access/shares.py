"""How many directories and files of the protected trees are marked and walked: in all, and
per owner.

Each directory of a protected tree gets an inode mark, and each file one of its own
(fanwatch.py). A mark pins its inode in kernel memory (the group is made with
FAN_UNLIMITED_MARKS, so the kernel sets no limit), every mark is a round trip to the
responder, and the walks that set them and rebuild the identity index (identity.py) visit
every directory. A user who can write anywhere under a protected tree can make millions of
directories there in minutes: unbounded, that pins gigabytes of the node's memory and makes
every start and index rebuild last minutes. A bound in all alone would be worse: the user's
own directories, met first in the walk, would use it up, and the real assets past them would
not be watched. So each owner (uid) has a share: a user's directories use up that user's
share, not the marks that watch everyone else's files. A directory past its owner's share is
not walked either (what lies under it is that owner's, or there by that owner's leave); the
sensor says how many were refused, and whose. A user's subordinate uids (/etc/subuid: what
a rootless container chowns to) count as that user (sensors/subuids.py). Once a bound in
all is reached, what is past it is refused without an lstat each.
"""

from __future__ import annotations

import os
import stat
from collections import Counter
from collections.abc import Callable

# Directories marked and walked, at most: in all, and of one owner. A dataset of 10,000
# classes in 100 shards each fits one owner's share.
MAX_DIRS = 200_000
MAX_DIRS_PER_OWNER = 20_000
# Files marked one by one, at most (past it, a file is seen through its directory's mark).
MAX_FILES = 200_000
MAX_FILES_PER_OWNER = 50_000
# Files the identity index knows (identity.py), at most: in all, and of one owner.
MAX_INDEXED = 1_000_000
MAX_INDEXED_PER_OWNER = 200_000
NOTED_OWNERS = 3  # owners named in a note, the most refused first
# Entries looked at (an lstat each) in the shared directories of an owner whose share is used
# up, at most per walk: past that, what lies in any directory of that owner is refused as
# hers without a look (she may make her own directories group-writable).
MAX_LOOKS_WHEN_SPENT = 10_000


class OwnerShares:
    """Marks (or visits) of one kind handed out: at most `total`, `per_owner` of one owner
    (`owner_of` a uid: the uid itself, or the user of its subordinate range, subuids.py)."""

    def __init__(
        self,
        total: int,
        per_owner: int,
        owner_of: Callable[[int], int] = int,
    ):
        self.total = total
        self.per_owner = per_owner
        self.owner_of = owner_of
        self.used = 0
        self.by_owner: Counter[int | None] = Counter()
        self.refused: Counter[int | None] = Counter()  # owner (None: not looked at) -> count
        self.refusals = 0  # all refusals so far, and the owner of the last one (`refusal`)
        self.last_refused: int | None = None
        # the directories charged while the watch runs, by identity (st_dev << 64 | st_ino):
        # one a walk meets again, moved in twice or met by both the reader and the walker, is
        # not charged twice (its mark is made again: harmless, and right when the inode is a
        # reused one). Bounded by the shares themselves.
        self.charged: set[int] = set()
        # a directory, its owner (None: root's) and whether others may write in it (spent_in)
        self._listed: tuple[str, int | None, bool] | None = None
        self.looks: Counter[int] = Counter()  # owner -> entries looked at in her shared dirs

    @property
    def full(self) -> bool:
        return self.used >= self.total

    def take(self, uid: int, identity: int | None = None) -> bool:
        """One more for the owner of `uid`, if the shares allow it (a refusal is counted);
        with the `identity` of a directory met while the watch runs, nothing more for one
        already charged."""
        if identity is not None and identity in self.charged:
            return True
        owner = self.owner_of(uid)
        if self.full or self.by_owner[owner] >= self.per_owner:
            self._refuse(owner)
            return False
        self.used += 1
        self.by_owner[owner] += 1
        if identity is not None:
            self.charged.add(identity)
        return True

    def _refuse(self, owner: int | None) -> None:
        self.refused[owner] += 1
        self.refusals += 1
        self.last_refused = owner

    def refuse_unlooked(self) -> None:
        """One refused without looking at its owner: all are handed out."""
        self._refuse(None)

    def take_entry(
        self, entry: os.DirEntry[str], directory: str | None = None, remember: bool = False
    ) -> bool:
        """`take` for the owner of a directory entry of `directory` (by default, the one its
        path names); one that cannot be looked at is not walked (it is gone, or unreadable to
        root: nothing to mark). `remember`: charged by identity (`take`)."""
        if self.full:
            self.refuse_unlooked()
            return False
        if self.spent_in(os.path.dirname(entry.path) if directory is None else directory):
            return False
        try:
            info = entry.stat(follow_symlinks=False)
        except OSError:
            return False
        return self.take(info.st_uid, identity_of(info) if remember else None)

    def spent_in(self, directory: str) -> bool:
        """Whether an entry of `directory` is refused without an lstat: the directory is not
        root's, and its owner's share is used up. What lies in a directory only its owner
        can write is hers (or root's), and is refused as hers (a million names in one
        directory cost a million lstats at every walk); in one others may write in too (a
        group project's), another user's directory keeps its own share, so its entries are
        looked at, MAX_LOOKS_WHEN_SPENT of them at most. Root's directories are looked at
        entry by entry."""
        if self._listed is None or self._listed[0] != directory:
            owner: int | None = None  # None: root's, or not known: entry by entry
            shared = False
            try:
                info = os.lstat(directory)
            except OSError:
                pass
            else:
                if info.st_uid != 0:
                    owner = self.owner_of(info.st_uid)
                    shared = bool(info.st_mode & (stat.S_IWGRP | stat.S_IWOTH))
            self._listed = (directory, owner, shared)
        _, owner, shared = self._listed
        if owner is None or self.by_owner[owner] < self.per_owner:
            return False
        if shared and self.looks[owner] < MAX_LOOKS_WHEN_SPENT:
            self.looks[owner] += 1
            return False
        self._refuse(owner)
        return True

    def take_path(self, path: str) -> bool:
        try:
            uid = os.lstat(path).st_uid
        except OSError:
            return False
        return self.take(uid)

    def refusal(self) -> str:
        """Why the last one refused was."""
        if self.full or self.last_refused is None:
            return f"the bound of {self.total:,} in all is reached"
        owner = _owner_text(self.last_refused)
        return f"its owner ({owner}) has its share of {self.per_owner:,}"

    def summary(self, what: str, why: str) -> str | None:
        """What was refused, and whose: None when nothing was."""
        refused = sum(self.refused.values())
        if not refused:
            return None
        owners = ", ".join(
            f"{_owner_text(owner)}: {count:,}"
            for owner, count in self.refused.most_common(NOTED_OWNERS)
        )
        more = "" if len(self.refused) <= NOTED_OWNERS else ", …"
        return (
            f"{refused:,} {what} under protected paths past the bound ({self.total:,} in all, "
            f"{self.per_owner:,} of one owner) are {why} ({owners}{more})"
        )


def identity_of(info: os.stat_result) -> int:
    """A file's identity on the node, as one int (st_dev, st_ino)."""
    return info.st_dev << 64 | info.st_ino


def _owner_text(owner: int | None) -> str:
    if owner is None:
        return "owners not looked at, all shares handed out"
    if owner < 0:
        return "a subordinate uid range of a user not in the node's passwd"
    return f"uid {owner}"

"""A directory tree walked without recursion.

Python 3.11's os.walk recurses once per directory level, so a user who can write under a
protected tree and nests 1,000 directories made it raise RecursionError: the asset index
and the fanotify marks failed at every start, and file-access detection was off for every
user. This walk keeps its own stack.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator


def walk_tree(
    root: str, descend: Callable[[os.DirEntry[str]], bool] | None = None
) -> Iterator[tuple[str, list[str]]]:
    """(directory, names of what is not a directory in it), top-down and depth-first in the
    order os.walk gives; symlinks are not followed (a link to a directory is a name). A
    directory that cannot be listed is skipped, as os.walk skips it; so is a subdirectory
    `descend` refuses (it is neither listed nor walked: shares.py bounds the walk so)."""
    stack = [root]
    while stack:
        directory = stack.pop()
        try:
            with os.scandir(directory) as entries:
                listed = list(entries)
        except OSError:
            continue
        names: list[str] = []
        subdirs: list[str] = []
        for entry in listed:
            try:
                is_dir = entry.is_dir(follow_symlinks=False)
            except OSError:
                is_dir = False
            if not is_dir:
                names.append(entry.name)
            elif descend is None or descend(entry):
                subdirs.append(entry.name)
        yield directory, names
        stack.extend(os.path.join(directory, name) for name in reversed(subdirs))

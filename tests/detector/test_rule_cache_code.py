"""The rule cache's code fingerprint: an edited parsing source never reads an old entry, though
the sources are identified by their stat (not read) on every load."""

from __future__ import annotations

import hashlib
import os
import time
from pathlib import Path

from hpcsec.detector.engine import rulecache

FAR_LATER = 2**62  # a clock long past every file's times: no file counts as just changed


def code_dir(tmp_path: Path) -> Path:
    directory = tmp_path / "code"
    directory.mkdir()
    (directory / "parse.py").write_text("LIMIT = 1\n")
    (directory / "other.py").write_text("X = 2\n")
    return directory


def edit_in_place_keeping_mtime(path: Path, text: str) -> None:
    """Same size, same inode, the mtime put back: only the ctime can tell."""
    before = path.stat()
    assert len(text) == before.st_size
    with open(path, "r+") as f:
        f.write(text)
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))


def test_an_in_place_edit_with_the_mtime_put_back_changes_the_fingerprint(tmp_path):
    directory = code_dir(tmp_path)
    code = directory / "parse.py"
    before = rulecache.fingerprint([directory])
    state = rulecache.code_state(str(code), FAR_LATER)
    # past the kernel's timestamp tick (a few ms), so that the edit's ctime is a new one
    time.sleep(0.05)
    edit_in_place_keeping_mtime(code, "LIMIT = 9\n")
    assert rulecache.code_state(str(code), FAR_LATER) != state  # told by its stat alone
    assert rulecache.fingerprint([directory]) != before


def test_a_replaced_file_changes_the_fingerprint(tmp_path):
    directory = code_dir(tmp_path)
    code = directory / "parse.py"
    state = rulecache.code_state(str(code), FAR_LATER)
    replacement = tmp_path / "new.py"
    replacement.write_text("LIMIT = 9\n")
    info = code.stat()
    os.utime(replacement, ns=(info.st_atime_ns, info.st_mtime_ns))
    os.replace(replacement, code)
    assert rulecache.code_state(str(code), FAR_LATER) != state


def test_a_file_changed_within_the_clock_tick_is_told_by_its_bytes(tmp_path):
    """An edit right after the last one may keep every time (coarse file system clocks): a
    file that recent is identified by its contents as well; an older one by its stat alone."""
    code = code_dir(tmp_path) / "parse.py"
    info = code.stat()
    just_now = max(info.st_mtime_ns, info.st_ctime_ns) + 1
    digest = hashlib.sha256(code.read_bytes()).digest()
    stat_alone = rulecache.code_state(str(code), FAR_LATER)
    assert rulecache.code_state(str(code), just_now) == stat_alone + digest
    edit_in_place_keeping_mtime(code, "LIMIT = 9\n")  # at once: maybe the same ctime
    assert rulecache.code_state(str(code), just_now).endswith(
        hashlib.sha256(b"LIMIT = 9\n").digest()
    )


def test_new_and_removed_code_files_change_the_fingerprint(tmp_path):
    directory = code_dir(tmp_path)
    before = rulecache.fingerprint([directory])
    (directory / "added.py").write_text("")
    added = rulecache.fingerprint([directory])
    (directory / "other.py").unlink()
    assert len({before, added, rulecache.fingerprint([directory])}) == 3


def test_the_fingerprint_is_stable_and_none_when_the_code_is_gone(tmp_path):
    assert rulecache.fingerprint() == rulecache.fingerprint() is not None
    assert rulecache.fingerprint([tmp_path / "absent"]) is None

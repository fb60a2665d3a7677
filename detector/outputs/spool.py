"""Durable on-disk spool, one per destination: an alert is on disk before it is sent.

Layout under the spool directory (a crash at any instant leaves either the old or the new
state, never a torn file):

    <spool>/<destination key>/destination   the destination's name (URL without secrets)
    <spool>/<destination key>/lock          flock held by the process that owns the spool
    <spool>/<destination key>/tmp/          files being written (deleted at the next open)
    <spool>/<destination key>/pending/      segments: N.jsonl, one alert per line, written
                                            once; N.marks, one byte per line, settled or not
    <spool>/<destination key>/failed/       alerts the receiver refused for good, with .reason

Each `add_many` call writes one segment to tmp/, fsyncs it, renames it into pending/ and
fsyncs the directory before it returns: one fsync per batch, not per alert, which is what
keeps a slow disk from capping the alert rate. A delivery is recorded (its byte in .marks,
which needs no new disk space) before the next alert is sent, and the segment is deleted once
every line is settled. Delivery is at least once (only a power loss can lose a mark);
receivers deduplicate on `alert.id` (the webhook's Idempotency-Key). A spool that cannot be
written (disk full) raises SpoolError and leaves nothing in tmp/; delivery.py then sends those
alerts directly. An unreadable line is moved to failed/ and counted in `corrupt`.

Full spool (pending bytes would exceed max_bytes): older alerts of a LOWER level than the new
one are evicted, lowest level and oldest first, to make room; if that cannot make room, the new
alert is refused. Nothing goes silently: every eviction or refusal is counted in one `spool
full` notice alert per episode, kept at the front of this destination's queue (it does not
count against the bound and is rewritten in place while it waits), and returned to the caller.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from hpcsec.detector.core.private_fs import write_private_file
from hpcsec.detector.core.schema import LEVELS, rfc3339
from hpcsec.detector.outputs.alertjson import alert_bytes
from hpcsec.detector.outputs.protocol import Alert
from hpcsec.detector.outputs.spool_dir import SpoolError, claim_spool_dir
from hpcsec.detector.outputs.spool_files import (
    NOTICE_NAME,
    PENDING,
    SEGMENT_NAME,
    SegmentFiles,
    fsync_dir,
    marks_name,
    settled_lines,
    unlink_quietly,
    write_durably,
)
from hpcsec.detector.outputs.spool_notice import new_notice, with_drops


def eviction_rank(alert: Alert) -> int:
    try:
        return LEVELS.index(str(alert.get("rule.level")))
    except ValueError:
        return LEVELS.index("medium")  # an unknown level is neither thrown away first nor last


@dataclass(frozen=True)
class SpoolEntry:
    key: tuple[str, int]  # (file in pending/, line number)
    alert: Mapping[str, Any]
    alert_id: str


@dataclass(frozen=True)
class Admission:
    dropped_ids: tuple[str, ...]
    notice: Mapping[str, Any] | None  # the episode's `spool full` notice, when this call
    #                                   dropped alerts


@dataclass
class _Meta:
    level: int
    offset: int
    size: int
    notice: bool = False


class Spool:
    def __init__(self, path: Path, destination: str, max_bytes: int, lock_fd: int):
        self.path, self.destination, self.max_bytes = path, destination, max_bytes
        self.pending = path / "pending"
        self._lock_fd = lock_fd
        self._index: dict[tuple[str, int], _Meta] = {}  # in arrival order
        self._live: dict[str, int] = {}  # segment -> lines not settled yet
        self._used = 0  # bytes of unsettled alerts, the notice excluded
        self._seq = 0
        self._notice_name: str | None = None
        self._notice: dict[str, Any] | None = None
        self.corrupt = 0  # unreadable lines moved to failed/
        self._files = SegmentFiles(self.pending)

    @classmethod
    def open(cls, root: Path, destination: str, *, max_bytes: int) -> Spool:
        path, fd = claim_spool_dir(Path(root), destination)
        spool = cls(path, destination, max_bytes, fd)
        spool._load()
        return spool

    def _load(self) -> None:
        for leftover in (self.path / "tmp").iterdir():  # never committed: not accepted yet
            leftover.unlink(missing_ok=True)
        for entry in sorted(self.pending.iterdir()):
            name = entry.name
            if NOTICE_NAME.match(name):
                self._notice_name = name
                self._index[(name, 0)] = _Meta(
                    LEVELS.index("high"), 0, entry.stat().st_size, notice=True
                )
                with contextlib.suppress(OSError, orjson.JSONDecodeError):
                    self._notice = orjson.loads(entry.read_bytes())
            elif SEGMENT_NAME.match(name):
                self._load_segment(name)
            elif name.endswith((".done", ".marks")):
                if not (self.pending / (name.rsplit(".", 1)[0] + ".jsonl")).exists():
                    entry.unlink(missing_ok=True)  # its segment was settled and deleted
            else:
                self._quarantine_file(name, "not a spool file name")

    def _load_segment(self, name: str) -> None:
        done = settled_lines(self.pending, name)
        offset = 0
        with open(self.pending / name, "rb") as fh:
            for number, line in enumerate(fh):
                size = len(line)
                if number not in done:
                    try:
                        alert = orjson.loads(line)
                        if not isinstance(alert, dict):
                            raise ValueError("not a JSON object")
                    except ValueError as exc:
                        self._quarantine_line(name, number, line, f"unreadable spool line: {exc}")
                    else:
                        self._index[(name, number)] = _Meta(eviction_rank(alert), offset, size)
                        self._live[name] = self._live.get(name, 0) + 1
                        self._used += size
                offset += size
        if not self._live.get(name):
            self._drop_segment(name)

    # -- queue -------------------------------------------------------------------------------

    def depth(self) -> int:
        return len(self._index)

    def take_corrupt(self) -> int:
        """Unreadable lines and files found since the last call (they are in failed/)."""
        count, self.corrupt = self.corrupt, 0
        return count

    def bytes_used(self) -> int:
        return self._used

    def _read(self, key: tuple[str, int]) -> bytes:
        meta = self._index[key]
        if meta.notice:
            return (self.pending / key[0]).read_bytes()
        return self._files.read(key[0], meta.offset, meta.size)

    def next_entry(self) -> SpoolEntry | None:
        """The oldest pending alert (the `spool full` notice first)."""
        while self._index:
            notice_key = (self._notice_name, 0)
            key = notice_key if notice_key in self._index else next(iter(self._index))
            try:
                raw = self._read(key)
                alert = orjson.loads(raw)
                if not isinstance(alert, dict):
                    raise ValueError("not a JSON object")
            except (OSError, ValueError) as exc:
                if self._index[key].notice:
                    self._quarantine_file(key[0], f"unreadable spool file: {exc}")
                    self._forget_notice(key)
                else:
                    self._quarantine_line(key[0], key[1], b"", f"unreadable spool line: {exc}")
                    self._settle(key)
                continue
            return SpoolEntry(key, alert, str(alert.get("alert.id")))
        return None

    def remove(self, entry: SpoolEntry) -> None:
        """The receiver has the alert."""
        if entry.key in self._index and self._index[entry.key].notice:
            (self.pending / entry.key[0]).unlink(missing_ok=True)
            self._forget_notice(entry.key)  # the next drop starts a new episode
        else:
            self._settle(entry.key)

    def reject(self, entry: SpoolEntry, reason: str) -> None:
        """The receiver refused this alert for good: keep it, with why, out of the queue."""
        if entry.key in self._index and self._index[entry.key].notice:
            self._quarantine_file(entry.key[0], reason)
            self._forget_notice(entry.key)
            return
        self._quarantine_line(entry.key[0], entry.key[1], alert_bytes(entry.alert), reason)
        self._settle(entry.key)

    def _forget_notice(self, key: tuple[str, int]) -> None:
        self._index.pop(key, None)
        self._notice_name, self._notice = None, None

    def _settle(self, key: tuple[str, int]) -> None:
        meta = self._index.pop(key, None)
        if meta is None:
            return
        self._used -= meta.size
        segment, number = key
        self._live[segment] -= 1
        if self._live[segment] == 0:
            self._drop_segment(segment)
        else:
            self._files.mark_done(segment, number)

    def _drop_segment(self, segment: str) -> None:
        self._live.pop(segment, None)
        self._files.drop(segment)

    def _quarantine_line(self, segment: str, number: int, line: bytes, reason: str) -> None:
        base = self.path / "failed" / f"{segment[:-6]}-{number}.json"
        with contextlib.suppress(OSError):
            if not line:
                line = self._files.read_line(segment, number)
            write_private_file(base, line)
            write_private_file(base.with_name(base.name + ".reason"), (reason + "\n").encode())
        if reason.startswith("unreadable"):
            self.corrupt += 1

    def _quarantine_file(self, name: str, reason: str) -> None:
        with contextlib.suppress(OSError):
            os.replace(self.pending / name, self.path / "failed" / name)
            write_private_file(self.path / "failed" / (name + ".reason"), (reason + "\n").encode())
        if reason.startswith("unreadable") or reason.startswith("not a spool"):
            self.corrupt += 1

    # -- admission ---------------------------------------------------------------------------

    def _new_stem(self) -> str:
        self._seq = (self._seq + 1) % 1_000_000
        return f"{time.time_ns():020d}-{os.getpid()}-{self._seq:06d}"

    def _write_tmp(self, name: str, data: bytes) -> None:
        write_durably(self.path / "tmp" / name, data)

    def _evict_for(self, level: int, need: int) -> list[tuple[str, int]] | None:
        """Keys to evict so `need` more bytes fit, or None when evicting cannot make room."""
        free = self.max_bytes - self._used
        if need <= free:
            return []
        victims = sorted(
            (m.level, key) for key, m in self._index.items() if not m.notice and m.level < level
        )
        chosen = []
        for _, key in victims:
            chosen.append(key)
            free += self._index[key].size
            if need <= free:
                return chosen
        return None

    def add_many(self, alerts: Sequence[Alert]) -> Admission:
        """Commit `alerts` to disk (one segment: write, fsync, rename) before returning."""
        dropped: list[tuple[str, int]] = []
        lines: list[bytes] = []
        metas: list[_Meta] = []
        evicted: list[tuple[str, int]] = []  # settled only once the new segment is on disk
        sizes: dict[tuple[str, int], int] = {}
        reserved = 0
        for alert in alerts:
            line = alert_bytes(alert) + b"\n"
            level = eviction_rank(alert)
            self._used += reserved  # count this batch's lines while choosing victims
            try:
                victims = self._evict_for(level, len(line))
                victims = None if victims is None else [v for v in victims if v not in evicted]
            finally:
                self._used -= reserved
            if victims is None:
                dropped.append((str(alert.get("alert.id")), level))
                continue
            for victim in victims:
                dropped.append((self._read_id(victim), self._index[victim].level))
                evicted.append(victim)
                sizes[victim] = self._index[victim].size
                self._used -= self._index[victim].size
                self._index[victim].size = 0  # its bytes are free for this batch
            metas.append(_Meta(level, reserved, len(line)))  # offset: the bytes before it
            lines.append(line)
            reserved += len(line)
        segment = self._new_stem() + ".jsonl"
        try:
            notice = self._commit(segment, lines, dropped)
        except OSError as exc:
            for victim in evicted:  # nothing was evicted after all
                self._index[victim].size = sizes[victim]
                self._used += sizes[victim]
            raise SpoolError(f"cannot write to spool {self.path}: {exc.strerror}") from None
        for number, meta in enumerate(metas):
            self._index[(segment, number)] = meta
        if metas:
            self._live[segment] = len(metas)
        self._used += reserved
        for victim in evicted:
            self._settle(victim)
        return Admission(tuple(i for i, _ in dropped), notice)

    def _commit(
        self, segment: str, lines: list[bytes], dropped: list[tuple[str, int]]
    ) -> dict[str, Any] | None:
        """Write the segment and its marks (and the notice) into pending/, durably; on an
        error nothing of this call stays on disk: a full disk is not filled further."""
        written: list[Path] = []
        try:
            if lines:
                marks = marks_name(segment)
                for name, data in ((segment, b"".join(lines)), (marks, PENDING * len(lines))):
                    written.append(self.path / "tmp" / name)
                    self._write_tmp(name, data)
            notice = self._record_drops(dropped) if dropped else None
            if lines:  # the marks first: a segment in pending/ always has them
                os.replace(self.path / "tmp" / marks, self.pending / marks)
                written.append(self.pending / marks)
                os.replace(self.path / "tmp" / segment, self.pending / segment)
            if lines or notice is not None:
                fsync_dir(self.pending)
            return notice
        except OSError:
            unlink_quietly(*written, *([self.pending / segment] if lines else []))
            raise

    def _read_id(self, key: tuple[str, int]) -> str:
        try:
            return str(orjson.loads(self._read(key)).get("alert.id"))
        except (OSError, ValueError, AttributeError):
            return f"<unreadable {key[0]}:{key[1]}>"

    def _record_drops(self, dropped: list[tuple[str, int]]) -> dict[str, Any]:
        now = rfc3339()
        notice = self._notice
        if notice is None or (self._notice_name, 0) not in self._index:
            notice = new_notice(self.destination, now)
            self._notice_name = self._new_stem() + "-notice.json"
        notice = with_drops(
            notice, dropped, destination=self.destination, max_bytes=self.max_bytes, now=now
        )
        data = alert_bytes(notice)
        name = self._notice_name
        assert name is not None
        try:
            self._write_tmp(name, data)
        except OSError:
            unlink_quietly(self.path / "tmp" / name)
            raise
        os.replace(self.path / "tmp" / name, self.pending / name)
        self._index[(name, 0)] = _Meta(LEVELS.index("high"), 0, len(data), notice=True)
        self._notice = notice
        return notice

    def close(self) -> None:
        self._files.close()
        if self._lock_fd >= 0:
            os.close(self._lock_fd)  # releases the flock
            self._lock_fd = -1

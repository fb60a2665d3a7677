"""What the file-access sensor and its fanotify stream share: access records (the lines of a
snapshot's `file-events.jsonl`), the folding queue between the stream's reader and the
sensor, what a drain of the stream hands over, and the accessing process's fields.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field
from typing import Any, Protocol

from hpcsec.detector.core.schema import FILE_ACTIONS
from hpcsec.sensors.base import SensorContext
from hpcsec.sensors.procinfo import (
    Users,
    environ_value,
    owner_key,
    process_fields,
    read_environ,
)

DEFAULT_MAX_RECORDS = 100_000


@dataclass
class AccessRecord:
    """What one pid did to one path during one interval (a `file-events.jsonl` line)."""

    time: str
    pid: int
    path: str
    actions: list[str]
    count: int = 1
    size: int | None = None
    target: str | None = None  # new path of a rename
    asset: str | None = None  # the protected file's own path, when `path` reached it otherwise

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "time": self.time,
            "pid": self.pid,
            "path": self.path,
            "actions": self.actions,
            "count": self.count,
        }
        if self.size is not None:
            out["size"] = self.size
        if self.target is not None:
            out["target"] = self.target
        if self.asset is not None and self.asset != self.path:
            out["asset"] = self.asset
        return out


@dataclass
class Folder:
    """The bounded queue between the fanotify reader and the sensor: folds as it queues.

    Distinct (pid, path) records are capped at `max_records`; accesses that would need a
    new record past the cap are counted as dropped (and reported), never buffered.
    """

    max_records: int = DEFAULT_MAX_RECORDS
    records: dict[tuple[int, str], AccessRecord] = field(default_factory=dict)
    dropped: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(
        self,
        when: str,
        pid: int,
        path: str,
        action: str,
        size: int | None = None,
        target: str | None = None,
        asset: str | None = None,
    ) -> None:
        self.add_actions(when, pid, path, (action,), size, target, asset)

    def add_actions(
        self,
        when: str,
        pid: int,
        path: str,
        actions: tuple[str, ...],
        size: int | None = None,
        target: str | None = None,
        asset: str | None = None,
    ) -> None:
        """One kernel event (its mask may carry several actions: read and write merged)."""
        key = (pid, path)
        with self.lock:
            rec = self.records.get(key)
            if rec is None:
                if len(self.records) >= self.max_records:
                    self.dropped += len(actions)
                    return
                rec = self.records[key] = AccessRecord(when, pid, path, [], 0, size, target, asset)
            rec.count += len(actions)
            for action in actions:
                if action not in rec.actions:
                    rec.actions.append(action)
            if size is not None:
                rec.size = size
            if target is not None:
                rec.target = target

    def drop(self, count: int = 1) -> None:
        with self.lock:
            self.dropped += count

    def drain(self) -> tuple[list[AccessRecord], int]:
        """The records of the interval that ends now, and the drops since the last drain."""
        with self.lock:
            records, dropped = list(self.records.values()), self.dropped
            self.records, self.dropped = {}, 0
        return records, dropped


def records_jsonl(records: list[AccessRecord]) -> str:
    return "".join(json.dumps(r.to_json(), separators=(",", ":")) + "\n" for r in records)


def parse_records(text: str) -> tuple[list[AccessRecord], list[str]]:
    """`file-events.jsonl` -> (records, problems as `line N: what`)."""
    records, problems = [], []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
        except json.JSONDecodeError as exc:
            problems.append(f"line {number}: invalid JSON: {exc.msg}")
            continue
        problem = _record_problem(item)
        if problem:
            problems.append(f"line {number}: {problem}")
            continue
        records.append(
            AccessRecord(
                item["time"],
                item["pid"],
                item["path"],
                list(item["actions"]),
                item.get("count", 1),
                item.get("size"),
                item.get("target"),
                item.get("asset"),
            )
        )
    return records, problems


def _record_problem(item: Any) -> str | None:
    if not isinstance(item, dict):
        return "expected a JSON object"
    if not isinstance(item.get("time"), str) or not isinstance(item.get("path"), str):
        return '"time" and "path" must be strings'
    if not isinstance(item.get("pid"), int) or isinstance(item.get("pid"), bool):
        return '"pid" must be an integer'
    actions = item.get("actions")
    if not isinstance(actions, list) or not actions or any(a not in FILE_ACTIONS for a in actions):
        return f'"actions" must be a non-empty list of {", ".join(FILE_ACTIONS)}'
    if not isinstance(item.get("asset", ""), str):
        return '"asset" must be a string'
    count = item.get("count", 1)
    if not isinstance(count, int) or isinstance(count, bool) or count < 1:
        return '"count" must be a positive integer'
    return None


def file_fields(rec: AccessRecord) -> dict[str, Any]:
    directory, _, name = rec.path.rpartition("/")
    stem, dot, ext = name.rpartition(".")
    return {
        "file.path": rec.path,
        "file.name": name,
        "file.directory": directory or "/",
        "file.extension": ext if dot and stem else None,
        "file.size": rec.size,
        "file.target_path": rec.target,
        "file.access_count": rec.count if rec.count > 1 else None,
        "hpcsec.asset.path": rec.asset or rec.path,
    }


def access_process_fields(ctx: SensorContext, pid: int, users: Users) -> dict[str, Any]:
    """The accessing process: who it is, and what ties it to its Slurm job once it has
    exited (its cgroup, and SLURM_JOB_ID, forgeable, for detector/jobs.py)."""
    fields = process_fields(ctx, pid, users)
    if fields:
        cgroup = ctx.proc.read_text(f"{pid}/cgroup")
        if cgroup:
            fields["process.cgroup"] = cgroup.strip()
        owner = owner_key(ctx, pid, fields.get("user.id"))
        job_id = environ_value(read_environ(ctx.proc, pid, owner), "SLURM_JOB_ID")
        if job_id is not None:
            fields["process.env.SLURM_JOB_ID"] = job_id
    return fields


# One raw /proc input as the reader read it: ("file", "<pid>/status", bytes) or
# ("link", "<pid>/exe", target).
ProcInput = tuple[str, str, Any]


class ProcCapture:
    """The reader's Recorder: keeps the /proc files of the pid it is reading, so a snapshot
    sample gets them when its records are drained (the reader runs ahead of the samples)."""

    def __init__(self) -> None:
        self.inputs: list[ProcInput] = []

    def record_file(self, root: str, rel: str, data: bytes) -> None:
        self.inputs.append(("file", rel, data))

    def record_link(self, root: str, rel: str, target: str) -> None:
        self.inputs.append(("link", rel, target))

    def record_input(self, name: str, data: str) -> None:  # the reader reads only /proc
        pass


@dataclass(frozen=True)
class Drained:
    """What the stream gathered since the last drain."""

    records: list[AccessRecord]
    dropped: int
    processes: dict[int, dict[str, Any]]  # pid -> process fields read at its access
    proc_inputs: dict[int, tuple[ProcInput, ...]]  # pid -> its /proc files (when recording)
    errors: int
    last_error: str | None
    timeouts: int = 0  # permission events the responder answered without waiting for us
    restarts: int = 0  # responders started again after one died
    unwatched: int = 0  # new directories not marked: past their owner's share (shares.py)
    last_unwatched: str | None = None


class AccessStream(Protocol):
    """What the sensor needs of its live stream (fanwatch.FanotifyWatch)."""

    def pending(self) -> bool: ...
    def drain(self) -> Drained: ...
    def stop(self) -> None: ...

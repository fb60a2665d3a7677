"""Accesses to protected paths, with the accessing process — category `file_access`.

Live, two ways: with `--duration S` (or the agent's `stream` option) a fanotify stream
(sensors/fanwatch.py) watches the protected paths; without one (a one-shot `scan`), a walk
of /proc/*/fd (sensors/fdwalk.py) finds files held open under them. Both produce access
records, which are the `file-events.jsonl` raw input of a snapshot; events are always made
from those records, so a replay runs the very code a live run does.

A record folds the accesses of one pid to one path within one interval: a dataloader
reading a shard a million times gives one record with its count, not a million events.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from hpcsec.detector.core.schema import FILE_ACTIONS, Event, new_event
from hpcsec.sensors.base import SensorContext, SensorUnavailable
from hpcsec.sensors.procinfo import Users, environ_value, process_fields

EVENTS_FILE = "file-events.jsonl"
DEFAULT_MAX_RECORDS = 100_000
_ACTION_ORDER = {a: i for i, a in enumerate(FILE_ACTIONS)}


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
    ) -> None:
        self.add_actions(when, pid, path, (action,), size, target)

    def add_actions(
        self,
        when: str,
        pid: int,
        path: str,
        actions: tuple[str, ...],
        size: int | None = None,
        target: str | None = None,
    ) -> None:
        """One kernel event (its mask may carry several actions: read and write merged)."""
        key = (pid, path)
        with self.lock:
            rec = self.records.get(key)
            if rec is None:
                if len(self.records) >= self.max_records:
                    self.dropped += len(actions)
                    return
                rec = self.records[key] = AccessRecord(when, pid, path, [], 0, size, target)
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
    count = item.get("count", 1)
    if not isinstance(count, int) or isinstance(count, bool) or count < 1:
        return '"count" must be a positive integer'
    return None


def file_fields(rec: AccessRecord) -> dict[str, Any]:
    name = rec.path.rsplit("/", 1)[-1]
    stem, dot, ext = name.rpartition(".")
    return {
        "file.path": rec.path,
        "file.name": name,
        "file.extension": ext if dot and stem else None,
        "file.size": rec.size,
        "file.target_path": rec.target,
        "file.access_count": rec.count if rec.count > 1 else None,
    }


def access_process_fields(ctx: SensorContext, pid: int, users: Users) -> dict[str, Any]:
    """The accessing process: who it is, and what ties it to its Slurm job once it has
    exited (its cgroup, and SLURM_JOB_ID, forgeable, for detector/jobs.py)."""
    fields = process_fields(ctx, pid, users)
    if fields:
        cgroup = ctx.proc.read_text(f"{pid}/cgroup")
        if cgroup:
            fields["process.cgroup"] = cgroup.strip()
        job_id = environ_value(ctx.proc.read_bytes(f"{pid}/environ"), "SLURM_JOB_ID")
        if job_id is not None:
            fields["process.env.SLURM_JOB_ID"] = job_id
    return fields


def record_events(
    ctx: SensorContext,
    records: list[AccessRecord],
    users: Users,
    known: dict[int, dict[str, Any]] | None = None,
) -> Iterator[Event]:
    """One event per action of each record, with the process and user of its pid.

    `known` holds process fields captured at the access (live); otherwise they are read
    through ctx.proc — from the snapshot sample when replaying.
    """
    cache: dict[int, dict[str, Any]] = {}
    for rec in records:
        if rec.pid not in cache:
            proc = dict((known or {}).get(rec.pid) or access_process_fields(ctx, rec.pid, users))
            if "user.id" in proc:
                proc["user.name"] = users.name(proc["user.id"])
            cache[rec.pid] = proc or {"process.pid": rec.pid}
        fields = {**file_fields(rec), **cache[rec.pid]}
        for action in sorted(rec.actions, key=_ACTION_ORDER.__getitem__):
            yield new_event("file_access", action, "file_access", ctx.host_name, rec.time, fields)


def protected_roots(ctx: SensorContext) -> list[str]:
    """--watch paths, else the directories the config's assets live under."""
    watch = ctx.options.get("watch") or []
    if watch:
        return sorted({os.path.abspath(p) for p in watch})
    assets = getattr(ctx.config, "assets", ()) or ()
    return sorted({root for asset in assets for root in asset.watch_roots()})


def path_filter(ctx: SensorContext, roots: list[str]):
    """Is a path protected: under a root and, for asset roots, matched by an asset glob."""
    prefixes = tuple(r.rstrip("/") + "/" for r in roots)
    by_asset = not ctx.options.get("watch") and ctx.config is not None

    def protected(path: str) -> bool:
        if not (path.startswith(prefixes) or path in roots):
            return False
        return not by_asset or ctx.config.asset_for(path) is not None

    return protected


class FileAccessSensor:
    name = "file_access"

    def __init__(self, max_records: int = DEFAULT_MAX_RECORDS):
        self.max_records = max_records
        self._watch = None  # fanwatch.FanotifyWatch, started by the first streaming sample
        self._dropped = 0
        self._errors: tuple[int, str | None] = (0, None)
        self._notes: list[str] = []

    def pending(self) -> bool:
        """Whether a streaming `collect` would return anything (the agent polls this often,
        so it only reads counters: no lock, no /proc). True before the stream is started."""
        return self._watch is None or self._watch.pending()

    def collect(self, ctx: SensorContext) -> Iterator[Event]:
        self._dropped, self._errors, self._notes = 0, (0, None), []
        roots: list[str] = [] if ctx.replaying else protected_roots(ctx)
        if not ctx.replaying and not roots:
            raise SensorUnavailable("no protected paths: give --watch PATH or assets in the config")
        known: dict[int, dict[str, Any]] = {}
        text = ctx.raw_input(EVENTS_FILE, lambda: self._live(ctx, roots, known))
        if text is None:
            raise SensorUnavailable(f"no {EVENTS_FILE} in this sample")
        records, problems = parse_records(text)
        for note in self._notes:
            yield ctx.status(self.name, "degraded", note)
        if problems:
            yield ctx.status(
                self.name,
                "malformed",
                f"{EVENTS_FILE}: " + "; ".join(problems[:5]),
                **{"hpcsec.malformed": len(problems)},
            )
        if self._errors[0]:
            yield ctx.status(
                self.name,
                "error",
                f"{self._errors[0]} fanotify reads or events not handled (last: {self._errors[1]})",
                **{"hpcsec.errors": self._errors[0]},
            )
        if self._dropped:
            yield ctx.status(
                self.name,
                "dropped",
                f"{self._dropped} accesses dropped: queue full or kernel overflow",
                **{"hpcsec.dropped": self._dropped},
            )
        if records:
            yield from record_events(ctx, records, Users.load(ctx.etc), known)

    def _live(self, ctx: SensorContext, roots: list[str], known: dict[int, dict[str, Any]]) -> str:
        duration = ctx.options.get("duration")
        if duration is None and not ctx.options.get("stream") and self._watch is None:
            from hpcsec.sensors.file_access.fdwalk import open_files

            return records_jsonl(open_files(ctx, path_filter(ctx, roots)))
        if self._watch is None:
            self._watch = self._start(ctx, roots)
        if duration:
            time.sleep(float(duration))
        drained = self._watch.drain()
        self._dropped = drained.dropped
        self._errors = (drained.errors, drained.last_error)
        known.update(drained.processes)
        if ctx.recorder is not None:  # this sample keeps the /proc entries read at the access
            for inputs in drained.proc_inputs.values():
                for kind, rel, data in inputs:
                    if kind == "file":
                        ctx.recorder.record_file("proc", rel, data)
                    else:
                        ctx.recorder.record_link("proc", rel, data)
        return records_jsonl(drained.records)

    def _start(self, ctx: SensorContext, roots: list[str]):
        from hpcsec.sensors.file_access.fanwatch import FanotifyWatch

        snapshot_dir = getattr(ctx.recorder, "directory", None)
        if snapshot_dir is not None:
            where = os.path.abspath(snapshot_dir)
            if any(where == r or where.startswith(r.rstrip("/") + "/") for r in roots):
                raise SensorUnavailable(
                    f"snapshot directory {where} is inside a watched path "
                    "(every file the snapshot writes would wait on the stream)"
                )
        try:
            watch = FanotifyWatch.start(
                ctx, roots, path_filter(ctx, roots), Folder(self.max_records)
            )
        except PermissionError as exc:
            raise SensorUnavailable(f"fanotify needs CAP_SYS_ADMIN (root): {exc}") from None
        except OSError as exc:
            raise SensorUnavailable(f"fanotify: {exc}") from None
        self._notes.extend(watch.notes)
        return watch

    def close(self) -> None:
        if self._watch is not None:
            self._watch.stop()
            self._watch = None

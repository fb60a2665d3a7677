"""Accesses to protected paths, with the accessing process — category `file_access`.

Live, two ways: with `--duration S` (or the agent's `stream` option) a fanotify stream
(fanwatch.py) watches the protected paths; without one (a one-shot `scan`), a walk
of /proc/*/fd (fdwalk.py) finds files held open under them. Both produce access
records, which are the `file-events.jsonl` raw input of a snapshot; events are always made
from those records, so a replay runs the very code a live run does.

A record folds the accesses of one pid to one path within one interval: a dataloader
reading a shard a million times gives one record with its count, not a million events.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from typing import Any

from hpcsec.detector.core.schema import FILE_ACTIONS, Event, new_event
from hpcsec.sensors.base import SensorContext, SensorUnavailable
from hpcsec.sensors.file_access.records import (
    DEFAULT_MAX_RECORDS,
    AccessRecord,
    AccessStream,
    Folder,
    access_process_fields,
    file_fields,
    parse_records,
    records_jsonl,
)
from hpcsec.sensors.procinfo import Users

EVENTS_FILE = "file-events.jsonl"
_ACTION_ORDER = {a: i for i, a in enumerate(FILE_ACTIONS)}


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
        self._watch: AccessStream | None = None  # started by the first streaming sample
        self._dropped = self._timeouts = self._restarts = 0
        self._errors: tuple[int, str | None] = (0, None)
        self._unwatched: tuple[int, str | None] = (0, None)  # new directories not marked
        self._notes: list[str] = []
        self._unwatched_notes: list[str] = []  # what the shares left unwatched at start

    def pending(self) -> bool:
        """Whether a streaming `collect` would return anything (the agent polls this often,
        so it only reads counters: no lock, no /proc). True before the stream is started."""
        return self._watch is None or self._watch.pending()

    def collect(self, ctx: SensorContext) -> Iterator[Event]:
        self._dropped, self._timeouts, self._errors, self._notes = 0, 0, (0, None), []
        self._restarts, self._unwatched, self._unwatched_notes = 0, (0, None), []
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
        for note in self._unwatched_notes:
            yield ctx.status(self.name, "unwatched", note)
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
        if self._unwatched[0]:
            yield ctx.status(
                self.name,
                "unwatched",
                f"{self._unwatched[0]} new directories under protected paths not watched or "
                f"not walked, past their owner's share or the walker's queue "
                f"(last: {self._unwatched[1]})",
                **{"hpcsec.errors": self._unwatched[0]},
            )
        if self._restarts:
            yield ctx.status(
                self.name,
                "responder_restarted",
                f"the fanotify responder died and was started again ({self._restarts} times): "
                "opens of protected files in between were not seen",
                **{"hpcsec.restarts": self._restarts},
            )
        if self._timeouts:
            yield ctx.status(
                self.name,
                "answer_timeout",
                f"{self._timeouts} opens of protected files let through by the fanotify "
                "responder before the agent read the opener (the agent was slow or stopped): "
                "their events may name the opener by its pid alone",
                **{"hpcsec.errors": self._timeouts},
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
            from hpcsec.sensors.file_access import fdwalk  # live only, as fanwatch below

            return records_jsonl(fdwalk.open_files(ctx, path_filter(ctx, roots)))
        if self._watch is None:
            self._watch = self._start(ctx, roots)
        if duration:
            time.sleep(float(duration))
        drained = self._watch.drain()
        self._dropped, self._timeouts = drained.dropped, drained.timeouts
        self._restarts = drained.restarts
        self._errors = (drained.errors, drained.last_error)
        self._unwatched = (drained.unwatched, drained.last_unwatched)
        known.update(drained.processes)
        if ctx.recorder is not None:  # this sample keeps the /proc entries read at the access
            for inputs in drained.proc_inputs.values():
                for kind, rel, data in inputs:
                    if kind == "file":
                        ctx.recorder.record_file("proc", rel, data)
                    else:
                        ctx.recorder.record_link("proc", rel, data)
        return records_jsonl(drained.records)

    def _start(self, ctx: SensorContext, roots: list[str]) -> AccessStream:
        snapshot_dir = getattr(ctx.recorder, "directory", None)
        if snapshot_dir is not None:
            where = os.path.abspath(snapshot_dir)
            if any(where == r or where.startswith(r.rstrip("/") + "/") for r in roots):
                raise SensorUnavailable(
                    f"snapshot directory {where} is inside a watched path "
                    "(every file the snapshot writes would wait on the stream)"
                )
        # Imported here: fanwatch loads libc (ctypes) at import, and a replay must not touch
        # the machine it runs on.
        from hpcsec.sensors.file_access import fanwatch

        try:
            watch = fanwatch.FanotifyWatch.start(
                ctx, roots, path_filter(ctx, roots), Folder(self.max_records)
            )
        except PermissionError as exc:
            raise SensorUnavailable(f"fanotify needs CAP_SYS_ADMIN (root): {exc}") from None
        except OSError as exc:
            raise SensorUnavailable(f"fanotify: {exc}") from None
        self._notes.extend(watch.notes)
        self._unwatched_notes.extend(watch.unwatched_notes)
        return watch

    def close(self) -> None:
        if self._watch is not None:
            self._watch.stop()
            self._watch = None

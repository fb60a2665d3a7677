"""The DuckDB alert store: events (kept `retention_days`), alerts, and delivery state.

Times are stored as naive UTC TIMESTAMPs (DuckDB's TIMESTAMPTZ would need pytz to read
back). Each alert and event is also kept whole as JSON in `doc`, so nothing a rule or an
analyst may need is lost to the columns picked for filtering.

A DuckDB file has one writer at a time. With `hold=False` (the default) every call opens the
file and closes it again; a busy file is retried for `lock_wait_s` before StoreError says
which process holds it.

The agent does not write here: it appends segments to `<store>.journal/` (journal.py). Opening
the store applies the finished segments in name order under the journal's lock, one
transaction each, deletes each once committed, then drops events older than the retention.
Re-applying a segment (a crash between commit and delete) changes nothing: events are
INSERT OR IGNORE, alerts and deliveries INSERT OR REPLACE in the order they were decided.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
from collections.abc import Iterable, Iterator, Mapping
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Protocol

import duckdb
import orjson

from hpcsec.detector.alerts.suppression import Decision, dispositions
from hpcsec.detector.core.log import get_logger
from hpcsec.detector.store.journal import (
    StoreError,
    journal_dir,
    list_segments,
    open_private_dir,
    read_segment,
)
from hpcsec.detector.store.private_files import StoreFileError, create_private_db, export_privately
from hpcsec.detector.store.query import AlertQuery, parse_since
from hpcsec.detector.store.rows import DISPOSITIONS, Rows, alert_row, event_row

__all__ = ["DISPOSITIONS", "AlertQuery", "Store", "StoreError", "parse_since"]
logger = get_logger(__name__)

SCHEMA_VERSION = 1
_DDL = (
    "CREATE TABLE IF NOT EXISTS meta (key VARCHAR PRIMARY KEY, value VARCHAR)",
    """CREATE TABLE IF NOT EXISTS events (
        event_id VARCHAR PRIMARY KEY, ts TIMESTAMP, category VARCHAR, action VARCHAR,
        host VARCHAR, sensor VARCHAR, job_id VARCHAR, user_name VARCHAR, doc VARCHAR)""",
    """CREATE TABLE IF NOT EXISTS alerts (
        alert_id VARCHAR PRIMARY KEY, ts TIMESTAMP, first_seen TIMESTAMP, last_seen TIMESTAMP,
        rule_id VARCHAR, rule_title VARCHAR, rule_level VARCHAR, rule_vector VARCHAR,
        host VARCHAR, job_id VARCHAR, user_name VARCHAR, count BIGINT,
        disposition VARCHAR, reason VARCHAR, summary VARCHAR, doc VARCHAR,
        stored_at TIMESTAMP)""",
    # added after the first release: a store written before has its alerts without one
    "ALTER TABLE alerts ADD COLUMN IF NOT EXISTS incident_id VARCHAR",
    """CREATE TABLE IF NOT EXISTS deliveries (
        alert_id VARCHAR, destination VARCHAR, state VARCHAR, error VARCHAR,
        updated TIMESTAMP, PRIMARY KEY (alert_id, destination))""",
    "CREATE INDEX IF NOT EXISTS events_ts ON events (ts)",
)
_ROWS_PER_INSERT = 400  # multi-row VALUES: far faster than executemany in DuckDB


def _scalar(con: duckdb.DuckDBPyConnection, sql: str, params: list[object] | None = None) -> int:
    """The one integer a `SELECT count(*)` returns."""
    row = con.execute(sql, params or []).fetchone()
    return int(row[0]) if row is not None else 0


def _has_incident_column(con: duckdb.DuckDBPyConnection) -> bool:
    sql = (
        "SELECT count(*) FROM information_schema.columns "
        "WHERE table_name = 'alerts' AND column_name = 'incident_id'"
    )
    return _scalar(con, sql) > 0


class DeliveryRecord(Protocol):
    """What happened to one alert at one destination (the outputs' DeliveryOutcome)."""

    @property
    def alert_id(self) -> str: ...
    @property
    def destination(self) -> str: ...
    @property
    def state(self) -> str: ...
    @property
    def error(self) -> str: ...


class Store:
    def __init__(
        self,
        path: str | Path,
        *,
        retention_days: int = 30,
        hold: bool = False,
        lock_wait_s: float = 5.0,
        read_only: bool = False,
    ):
        self.path = str(path)
        self.retention_days = retention_days
        self.hold, self.lock_wait_s, self.read_only = hold, lock_wait_s, read_only
        self._con: duckdb.DuckDBPyConnection | None = None
        journal = os.path.lexists(journal_dir(self.path))
        if read_only and not journal and not Path(self.path).is_file():
            raise StoreError(f"alert store {self.path} does not exist")
        if not read_only or journal:
            self._create_private()
            with self._connect(write=True) as con:
                for ddl in _DDL:
                    con.execute(ddl)
                con.execute(
                    "INSERT OR REPLACE INTO meta VALUES ('schema_version', ?)",
                    [str(SCHEMA_VERSION)],
                )
        if journal:
            self._apply_or_warn()

    # -- connections -------------------------------------------------------------------------

    def _create_private(self) -> None:
        """The database file as a 0600 file of ours: it holds command lines and environments."""
        try:
            create_private_db(self.path, lambda tmp: duckdb.connect(tmp).close())
        except StoreFileError as exc:
            raise StoreError(f"alert store: {exc.message}") from None
        except (OSError, duckdb.Error) as exc:
            why = getattr(exc, "strerror", None) or str(exc).splitlines()[0]
            raise StoreError(f"cannot create alert store {self.path}: {why}") from None

    def _open(self, read_only: bool) -> duckdb.DuckDBPyConnection:
        deadline = time.monotonic() + self.lock_wait_s
        while True:
            try:
                return duckdb.connect(self.path, read_only=read_only)
            except duckdb.IOException as exc:
                if "lock" not in str(exc).lower() or time.monotonic() >= deadline:
                    raise StoreError(
                        f"cannot open alert store {self.path}: {str(exc).splitlines()[0]}"
                    ) from None
                time.sleep(0.1)
            except duckdb.Error as exc:
                raise StoreError(
                    f"cannot open alert store {self.path}: {str(exc).splitlines()[0]}"
                ) from None

    @contextlib.contextmanager
    def _connect(self, write: bool = False) -> Iterator[duckdb.DuckDBPyConnection]:
        if self._con is not None:
            yield self._con
            return
        con = self._open(self.read_only and not write)
        if self.hold and not (write and self.read_only):
            self._con = con
            yield con
            return
        try:
            yield con
        finally:
            con.close()

    def close(self) -> None:
        if self._con is not None:
            self._con.close()
            self._con = None

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @staticmethod
    def _write(con: duckdb.DuckDBPyConnection, writes: list[tuple[str, str, list[tuple]]]) -> None:
        """`writes` ((verb, table, rows), …) in one transaction."""
        if not any(rows for _, _, rows in writes):
            return
        table = ""
        try:
            con.execute("BEGIN")
            try:
                for verb, table, rows in writes:
                    marks = "(" + ", ".join("?" * len(rows[0])) + ")" if rows else ""
                    for i in range(0, len(rows), _ROWS_PER_INSERT):
                        chunk = rows[i : i + _ROWS_PER_INSERT]
                        con.execute(
                            f"{verb} INTO {table} VALUES " + ", ".join([marks] * len(chunk)),
                            [v for row in chunk for v in row],
                        )
                con.execute("COMMIT")
            except BaseException:
                with contextlib.suppress(duckdb.Error):  # a failed COMMIT may have ended it
                    con.execute("ROLLBACK")
                raise
        except duckdb.Error as exc:
            # A full disk or an I/O error is the store's failure, reported as one: the caller
            # keeps the rows and tries again, it does not crash.
            raise StoreError(
                f"cannot write to alert store: {table}: {str(exc).splitlines()[0]}"
            ) from None

    # -- the agent's journal -----------------------------------------------------------------

    def _cutoff(self, now: datetime | None = None) -> datetime:
        return (now or datetime.now(UTC)).astimezone(UTC).replace(tzinfo=None) - timedelta(
            days=self.retention_days
        )

    def _apply_or_warn(self) -> None:
        """Apply the journal; a reader that may not (an analyst who can read the store but
        not the agent's private journal) still reads what was applied, and is told."""
        try:
            self.apply_journal()
        except StoreError as exc:
            if not self.read_only:
                raise
            logger.warning("%s; showing what was applied before", exc)

    def apply_journal(self) -> int:
        """Apply the agent's finished segments in name order, each in one transaction and
        deleted once committed, then drop events past the retention. Returns segments applied.
        A segment that fails to apply (a full disk) stays, with the ones after it."""
        jdir = journal_dir(self.path)
        if not os.path.lexists(jdir):
            return 0
        fd = open_private_dir(jdir, create=False)
        try:
            self._lock(fd, jdir)
            segments = list_segments(fd)
            if not segments:
                return 0
            cutoff = self._cutoff()
            with self._connect(write=True) as con:
                for _, name in segments:
                    rows = Rows()
                    for record in read_segment(fd, name):
                        rows.add_record(record, cutoff)
                    self._write(con, rows.writes())
                    os.unlink(name, dir_fd=fd)
                con.execute("DELETE FROM events WHERE ts < ?", [cutoff])
            return len(segments)
        except OSError as exc:
            raise StoreError(f"cannot apply store journal {jdir}: {exc.strerror}") from None
        finally:
            os.close(fd)  # releases the lock

    def _lock(self, fd: int, jdir: Path) -> None:
        """One applier at a time (the agent's hourly child and an analyst's query)."""
        deadline = time.monotonic() + self.lock_wait_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise StoreError(
                        f"store journal {jdir} is being applied by another process"
                    ) from None
                time.sleep(0.05)

    # -- writes ------------------------------------------------------------------------------

    def insert_events(self, events: Iterable[dict[str, Any]]) -> int:
        """Append events (an event id seen before is kept once). Returns rows offered."""
        rows = {row[0]: row for row in map(event_row, events)}
        with self._connect(write=True) as con:
            self._write(con, [("INSERT OR IGNORE", "events", list(rows.values()))])
        return len(rows)

    def insert_alerts(
        self, alerts: Iterable[Mapping[str, Any]], disposition: str = "sent", reason: str = ""
    ) -> int:
        """Store alerts; an alert id stored before is replaced (dedup grew its count)."""
        if disposition not in DISPOSITIONS:
            raise ValueError(f"disposition must be one of {DISPOSITIONS}")
        now = datetime.now(UTC).replace(tzinfo=None)
        rows = {row[0]: row for row in (alert_row(a, disposition, reason, now) for a in alerts)}
        with self._connect(write=True) as con:
            self._write(con, [("INSERT OR REPLACE", "alerts", list(rows.values()))])
        return len(rows)

    def insert_decision(self, decision: Decision) -> None:
        """Every alert of a suppression Decision with its disposition and the reason."""
        for alerts, disposition, reason in dispositions(decision):
            self.insert_alerts(alerts, disposition, reason)

    def record_deliveries(self, outcomes: Iterable[DeliveryRecord]) -> int:
        """Delivery state per (alert, destination); the latest state wins."""
        now = datetime.now(UTC).replace(tzinfo=None)
        rows = {
            (o.alert_id, o.destination): (o.alert_id, o.destination, o.state, o.error or None, now)
            for o in outcomes
        }
        with self._connect(write=True) as con:
            self._write(con, [("INSERT OR REPLACE", "deliveries", list(rows.values()))])
        return len(rows)

    def prune(self, now: datetime | None = None) -> int:
        """Delete events older than the retention; alerts are evidence and are kept."""
        cutoff = self._cutoff(now)
        with self._connect(write=True) as con:
            deleted = _scalar(con, "SELECT count(*) FROM events WHERE ts < ?", [cutoff])
            con.execute("DELETE FROM events WHERE ts < ?", [cutoff])
        return deleted

    # -- reads -------------------------------------------------------------------------------

    def query_alerts(self, q: AlertQuery) -> list[dict[str, Any]]:
        """Matching alerts by their time (first seen), oldest first (the newest `limit` of
        them), each the stored alert plus `hpcsec.disposition` and `hpcsec.deliveries`
        {destination: state}."""
        sql, params = q.select_sql()
        with self._connect() as con:
            if q.incident is not None and not _has_incident_column(con):
                return []  # a store no writer opened since incidents came: none has one
            rows = con.execute(sql, params).fetchall()
            states: dict[str, dict[str, str]] = {}
            if rows:
                ids = [r[0] for r in rows]
                marks = ", ".join("?" * len(ids))
                for aid, dest, state in con.execute(
                    f"SELECT alert_id, destination, state FROM deliveries WHERE alert_id IN "
                    f"({marks}) ORDER BY destination",
                    ids,
                ).fetchall():
                    states.setdefault(aid, {})[dest] = state
        out = []
        for aid, doc, disposition, reason in reversed(rows):
            alert = orjson.loads(doc)
            alert["hpcsec.disposition"] = disposition
            if reason:
                alert["hpcsec.disposition_reason"] = reason
            alert["hpcsec.deliveries"] = states.get(aid, {})
            out.append(alert)
        return out

    def count(self, table: str) -> int:
        if table not in ("events", "alerts", "deliveries"):
            raise ValueError(table)
        with self._connect() as con:
            return _scalar(con, f"SELECT count(*) FROM {table}")

    def export_events(self, path: str | Path, since: datetime | None = None) -> int:
        """Events to a Parquet file (columns named as the event schema, `doc` whole JSON)."""
        where, params = "", list[object]()
        if since is not None:
            where, params = "WHERE ts >= ?", [since.astimezone(UTC).replace(tzinfo=None)]
        select = (
            'SELECT event_id AS "event.id", ts AS "@timestamp", category AS '
            '"event.category", action AS "event.action", host AS "host.name", sensor AS '
            '"hpcsec.sensor", job_id AS "slurm.job.id", user_name AS "user.name", doc '
            f"FROM events {where} ORDER BY ts"
        )
        with self._connect() as con:

            def write(tmp: str) -> None:
                quoted = tmp.replace("'", "''")  # COPY takes no parameter for the file name
                con.execute(f"COPY ({select}) TO '{quoted}' (FORMAT PARQUET)", params)

            try:
                export_privately(path, write)
            except StoreFileError as exc:
                raise StoreError(f"cannot export events: {exc.message}") from None
            except (OSError, duckdb.Error) as exc:
                why = getattr(exc, "strerror", None) or str(exc).splitlines()[0]
                raise StoreError(f"cannot export events to {path}: {why}") from None
            return _scalar(con, f"SELECT count(*) FROM events {where}", params)

"""`hpcsec agent --nats`: the node's alerts and edge-filtered events to JetStream.

    agent loop ─▶ events()/alerts(): a bounded queue, never waits (what does not fit is
                  counted and reported as a `dropped` status event)
    tap thread ─▶ base-rule filter ─▶ spool on disk (private, under the spool directory)
               ─▶ JetStream publish ─▶ ack ─▶ settled in the spool

A message leaves the spool only on JetStream's ack, so NATS down (or an agent restart) loses
nothing the spool holds; it is published again with the same `Nats-Msg-Id`, so a retry after
a lost ack is stored once. That id is an HMAC of the alert's `alert.id` (or the event's
`event.id`) under the node's key, kept in its spool directory (msgid.py): JetStream drops a
message whose id it has seen from anyone, and alert ids are predictable (a hash of the rule,
its key and the time window), so a node publishing another node's alert id first had that
node's alert dropped as a duplicate. The spool is bounded
(`spool.max_bytes`): when full, events go before alerts and lower levels before higher ones
(detector/outputs/spool.py), and what was evicted is reported.
"""

from __future__ import annotations

import asyncio
import queue
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from nats.errors import Error as NatsError
from nats.js import JetStreamContext
from nats.js.errors import APIError

from hpcsec.detector.cluster.forwarder import BaseRuleFilter
from hpcsec.detector.cluster.msgid import MessageKeyError, message_id, message_key
from hpcsec.detector.cluster.partition import alert_subject
from hpcsec.detector.cluster.publisher import encode
from hpcsec.detector.cluster.streams import (
    API_TIMEOUT_S,
    EVENTS_STREAM,
    FIRST_CONNECT_S,
    NODE_ALERTS_STREAM,
    NODE_INBOX_PREFIX,
    ClusterError,
    connect,
    ensure_node_stream,
    require_jetstream,
)
from hpcsec.detector.core.schema import Event
from hpcsec.detector.engine.ruleset import RuleSet
from hpcsec.detector.outputs.alertjson import alert_bytes
from hpcsec.detector.outputs.spool import Spool, SpoolEntry, SpoolError
from hpcsec.detector.runtime.tap import Health

QUEUE_BATCHES = 1024  # batches waiting for the tap thread; beyond that they are dropped
RETRY_S = 1.0
SUBJECT = "hpcsec.nats.subject"
BODY = "hpcsec.nats.body"
EVENT_LEVEL = "informational"  # evicted before any alert when the spool is full


def spool_destination(urls: Sequence[str]) -> str:
    return "nats:" + ",".join(urls)


def _event_record(event: Event) -> dict[str, Any]:
    subject, payload, digest = encode(event)
    ident = str(event.get("event.id") or digest)
    return {"alert.id": ident, "rule.level": EVENT_LEVEL, SUBJECT: subject, BODY: payload.decode()}


def _alert_record(alert: Mapping[str, Any]) -> dict[str, Any]:
    level = str(alert.get("rule.level") or "medium")
    subject = alert_subject(alert.get("host.name"))
    body = alert_bytes(alert).decode()
    return {
        "alert.id": str(alert.get("alert.id")),
        "rule.level": level,
        SUBJECT: subject,
        BODY: body,
    }


class NatsTap:
    """An `EventTap` (detector/runtime/tap.py) publishing to JetStream from its own thread."""

    def __init__(self, urls: Sequence[str], spool_dir: Path, max_bytes: int):
        self.urls = list(urls)
        self.spool = Spool.open(spool_dir, spool_destination(urls), max_bytes=max_bytes)
        try:  # the node's one key, shared with `hpcsec publish` (msgid.py)
            self.message_key = message_key(spool_dir)
        except MessageKeyError:
            self.spool.close()
            raise
        self.published = 0
        self.last_error = ""
        self._queue: queue.Queue[tuple[str, Sequence[Any]]] = queue.Queue(QUEUE_BATCHES)
        self._filter: BaseRuleFilter | None = None
        self._lock = threading.Lock()
        self._dropped = 0  # events or alerts that did not fit in the queue or the spool
        self._stop = threading.Event()
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="hpcsec-nats-tap", daemon=True)
        self._thread.start()

    # -- the agent's side: never waits -------------------------------------------------------

    def rules(self, ruleset: RuleSet, placeholders: dict[str, list]) -> None:
        chooser = BaseRuleFilter(ruleset, placeholders)
        with self._lock:
            self._filter = chooser

    def events(self, events: list[Event]) -> None:
        self._offer("events", events)

    def alerts(self, alerts: Sequence[Mapping[str, Any]]) -> None:
        self._offer("alerts", list(alerts))

    def _offer(self, kind: str, items: Sequence[Any]) -> None:
        if not items:
            return
        try:
            self._queue.put_nowait((kind, items))
        except queue.Full:
            with self._lock:
                self._dropped += len(items)

    def take_health(self) -> list[Health]:
        with self._lock:
            dropped, self._dropped = self._dropped, 0
        if not dropped:
            return []
        message = (
            f"{dropped} events or alerts not published to NATS: the cluster queue or spool was full"
        )
        return [("cluster", "dropped", message, {"hpcsec.dropped": dropped})]

    def pending(self) -> int:
        return self._queue.qsize() + self.spool.depth()

    def close(self, timeout_s: float) -> int:
        """Publish what is queued and spooled within `timeout_s`; what is left stays in the
        spool for the next start. Returns how many messages were left."""
        if self._closed:
            return 0
        deadline = time.monotonic() + timeout_s
        while self.pending() and time.monotonic() < deadline and self._thread.is_alive():
            time.sleep(0.05)
        self._stop.set()
        # a connection attempt in progress ends within FIRST_CONNECT_S
        self._thread.join(max(deadline - time.monotonic(), 0.0) + FIRST_CONNECT_S + 1.0)
        left = self.pending()
        if not self._thread.is_alive():  # else the process exit ends it; the lock goes then
            self.spool.close()
        self._closed = True
        return left

    # -- the tap thread ----------------------------------------------------------------------

    def _intake(self) -> None:
        """Queued batches into the spool (filtered, encoded): on disk before any publish."""
        while True:
            try:
                kind, items = self._queue.get_nowait()
            except queue.Empty:
                return
            if kind == "events":
                with self._lock:
                    chooser = self._filter
                kept = chooser.select(list(items)) if chooser is not None else []
                records = [_event_record(e) for e in kept]
            else:
                records = [_alert_record(a) for a in items]
            if records:
                self._spool_records(records)

    def _spool_records(self, records: list[dict[str, Any]]) -> None:
        try:
            dropped = len(self.spool.add_many(records).dropped_ids)
        except SpoolError as exc:  # disk full: these are lost, and reported
            self.last_error, dropped = str(exc), len(records)
        if dropped:
            with self._lock:
                self._dropped += dropped

    def _run(self) -> None:
        asyncio.run(self._serve())

    async def _serve(self) -> None:
        while not self._stop.is_set():
            self._intake()
            try:
                nc = await connect(self.urls, inbox_prefix=NODE_INBOX_PREFIX)
            except ClusterError as exc:
                self.last_error = str(exc)
                await self._pause()
                continue
            try:
                await require_jetstream(nc, self.urls[0])
                for stream in (EVENTS_STREAM, NODE_ALERTS_STREAM):
                    await ensure_node_stream(nc, stream)
                await self._send_loop(nc.jetstream())
            except ClusterError as exc:
                self.last_error = str(exc)
                await self._pause()
            finally:
                await nc.close()

    async def _pause(self) -> None:
        """Wait before the next try, taking what the agent hands over meanwhile."""
        deadline = time.monotonic() + RETRY_S
        while time.monotonic() < deadline and not self._stop.is_set():
            self._intake()
            await asyncio.sleep(0.1)

    async def _send_loop(self, js: JetStreamContext) -> None:
        while not self._stop.is_set():
            self._intake()
            entry = self.spool.next_entry()
            if entry is None:
                if self._stop.is_set():
                    return
                await asyncio.sleep(0.05)
                continue
            if not await self._send(js, entry):
                raise ClusterError(self.last_error or "publish failed")

    async def _send(self, js: JetStreamContext, entry: SpoolEntry) -> bool:
        record = entry.alert
        subject = record.get(SUBJECT)
        if isinstance(subject, str) and isinstance(record.get(BODY), str):
            body = str(record[BODY]).encode()
        else:  # the spool's own `spool full` notice: an alert of this node
            subject, body = alert_subject(record.get("host.name")), alert_bytes(record)
        try:
            await js.publish(
                subject,
                body,
                timeout=API_TIMEOUT_S,
                headers={"Nats-Msg-Id": message_id(self.message_key, entry.alert_id)},
            )
        except (NatsError, APIError, TimeoutError) as exc:  # kept in the spool, sent later
            self.last_error = f"{type(exc).__name__}: {exc}"
            return False
        self.spool.remove(entry)
        self.published += 1
        return True

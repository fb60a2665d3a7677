"""A long-running process's events to JetStream, without ever blocking it on NATS.

An in-memory publisher (the agent's own, with a spool on disk, is agent_tap.py): `submit`
encodes events into a bounded in-memory spool and returns at once; a thread of its own
connects, keeps reconnecting, and publishes what is spooled. While NATS is down the spool
fills up to `max_bytes`; beyond that the oldest events are dropped and counted (a node must
not run out of memory because the hub's servers are down). Each message's `Nats-Msg-Id` is
an HMAC of its body's SHA-256 under a key (msgid.py): the node's, or one of this forwarder's
own, enough for a spool that lives in memory (its retries never outlive the process).

`BaseRuleFilter` picks what is worth sending: the events that match a base rule of a
correlation (the rest cannot contribute to a cross-node correlation).
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass

from nats.errors import Error as NatsError
from nats.js import JetStreamContext
from nats.js.errors import APIError

from hpcsec.detector.cluster.msgid import message_id, random_key
from hpcsec.detector.cluster.publisher import ATTEMPTS, encode
from hpcsec.detector.cluster.streams import (
    API_TIMEOUT_S,
    EVENTS_STREAM,
    NODE_INBOX_PREFIX,
    ClusterError,
    connect,
    ensure_node_stream,
    require_jetstream,
)
from hpcsec.detector.core.schema import Event
from hpcsec.detector.engine.evaluate import Engine
from hpcsec.detector.engine.ruleset import RuleSet

DEFAULT_MAX_BYTES = 64 * 1024**2
SEND_BATCH = 256
RETRY_S = 1.0

Message = tuple[str, bytes, str]  # subject, payload, message id


def base_rule_set(ruleset: RuleSet, placeholders: dict[str, list] | None = None) -> RuleSet:
    """The detection rules that correlations refer to, without the correlations (so that
    each base rule reports its own matches)."""
    engine = Engine(ruleset, placeholders=placeholders)
    bases = {s.id for c in engine.correlations for s in c.sources if s.kind == "detection"}
    subset = RuleSet()
    subset.rules = [r for r in ruleset.rules if r.id in bases or r.kind == "filter"]
    return subset


class BaseRuleFilter:
    def __init__(self, ruleset: RuleSet, placeholders: dict[str, list] | None = None):
        subset = base_rule_set(ruleset, placeholders)
        self.engine = Engine(subset, placeholders=placeholders)

    def select(self, events: list[Event]) -> list[Event]:
        matched = {id(e) for m in self.engine.evaluate(events) for e in m.events}
        return [e for e in events if id(e) in matched]


@dataclass
class ForwarderStats:
    published: int = 0
    dropped: int = 0
    last_error: str = ""


class EventForwarder:
    def __init__(
        self,
        urls: list[str],
        host_name: str | None = None,
        max_bytes: int = DEFAULT_MAX_BYTES,
        key: bytes | None = None,
    ):
        self.urls, self.host_name, self.max_bytes = urls, host_name, max_bytes
        self.key = key if key is not None else random_key()
        self.stats = ForwarderStats()
        self._spool: deque[Message] = deque()
        self._bytes = 0
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="hpcsec-forwarder", daemon=True)
        self._thread.start()

    def submit(self, events: Iterable[Event]) -> None:
        messages = [self._message(e) for e in events]
        with self._lock:
            for message in messages:
                self._spool.append(message)
                self._bytes += len(message[1])
            while self._bytes > self.max_bytes and self._spool:
                self._bytes -= len(self._spool.popleft()[1])
                self.stats.dropped += 1
        self._wake.set()

    def _message(self, event: Event) -> Message:
        subject, payload, digest = encode(dict(event), self.host_name)
        return subject, payload, message_id(self.key, digest)

    def pending(self) -> int:
        with self._lock:
            return len(self._spool)

    def close(self, timeout_s: float = 10.0) -> int:
        """Send what is spooled within `timeout_s`; returns how many events were left."""
        deadline = time.monotonic() + timeout_s
        while self.pending() and time.monotonic() < deadline:
            time.sleep(0.05)
        self._stop.set()
        self._wake.set()
        self._thread.join(max(deadline - time.monotonic(), 0.0) + 2.0)
        return self.pending()

    def _take(self) -> list[Message]:
        with self._lock:
            batch = [self._spool.popleft() for _ in range(min(SEND_BATCH, len(self._spool)))]
            self._bytes -= sum(len(m[1]) for m in batch)
        return batch

    def _put_back(self, batch: list[Message]) -> None:
        with self._lock:
            self._spool.extendleft(reversed(batch))
            self._bytes += sum(len(m[1]) for m in batch)

    def _run(self) -> None:
        asyncio.run(self._serve())

    async def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                nc = await connect(self.urls, inbox_prefix=NODE_INBOX_PREFIX)
            except ClusterError as exc:
                self.stats.last_error = str(exc)
                await asyncio.sleep(RETRY_S)
                continue
            try:
                await require_jetstream(nc, self.urls[0])
                await ensure_node_stream(nc, EVENTS_STREAM)
                await self._send_loop(nc.jetstream())
            except ClusterError as exc:
                self.stats.last_error = str(exc)
                await asyncio.sleep(RETRY_S)
            finally:
                await nc.close()

    async def _send_loop(self, js: JetStreamContext) -> None:
        while not self._stop.is_set():
            batch = self._take()
            if not batch:
                await asyncio.to_thread(self._wake.wait, 0.5)
                self._wake.clear()
                continue
            results = await asyncio.gather(*(self._send(js, m) for m in batch))
            failed = [m for m, ok in zip(batch, results, strict=True) if not ok]
            self.stats.published += len(batch) - len(failed)
            if failed:
                self._put_back(failed)
                raise ClusterError(self.stats.last_error or "publish failed")

    async def _send(self, js: JetStreamContext, message: Message) -> bool:
        subject, payload, ident = message
        for _ in range(ATTEMPTS):
            try:
                await js.publish(
                    subject,
                    payload,
                    timeout=API_TIMEOUT_S,
                    stream=EVENTS_STREAM,
                    headers={"Nats-Msg-Id": ident},
                )
                return True
            except (NatsError, APIError, TimeoutError) as exc:  # kept, retried later
                self.stats.last_error = f"{type(exc).__name__}: {exc}"
                await asyncio.sleep(0.2)
        return False

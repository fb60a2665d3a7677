"""The node side: events to the partitioned events stream, each acknowledged by JetStream.

Publishes run concurrently (IN_FLIGHT acks awaited at once); a publish that times out is
tried again with the same `Nats-Msg-Id`, so the stream keeps one copy even when the first
try was stored and only its ack was lost. That id is an HMAC of the body's SHA-256 under the
node's key (msgid.py): JetStream drops a message whose id it has seen from any node, and a
node that can predict another's event body (a periodic sample with known pids) must not be
able to publish that id first. A publish the server refuses (a subject this node's user may
not publish) is not tried again.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Iterable
from dataclasses import dataclass

import orjson
from nats.errors import Error as NatsError
from nats.js import JetStreamContext
from nats.js.errors import APIError

from hpcsec.detector.cluster.msgid import message_id, random_key
from hpcsec.detector.cluster.partition import partition_of, subject_for
from hpcsec.detector.cluster.streams import API_TIMEOUT_S, EVENTS_STREAM, refusal
from hpcsec.detector.core.jsonenc import dumps
from hpcsec.detector.core.schema import Event

IN_FLIGHT = 256
ATTEMPTS = 5  # with the pauses below: rides out a JetStream leader election (~5 s)


@dataclass
class PublishReport:
    published: int = 0
    failed: int = 0
    last_error: str = ""


def encode(event: Event, host_name: str | None = None) -> tuple[str, bytes, str]:
    """(subject, payload, digest) of one event: the digest (the body's SHA-256) is the
    event's own id, which `message_id` keys into its `Nats-Msg-Id`."""
    if host_name:
        event["host.name"] = host_name
    payload = dumps(event)
    digest = hashlib.sha256(payload).hexdigest()[:32]
    return subject_for(partition_of(event), event.get("host.name")), payload, digest


class Publisher:
    def __init__(
        self, js: JetStreamContext, host_name: str | None = None, key: bytes | None = None
    ):
        """`key`: the node's message-id key (msgid.message_key); without one, a key of this
        publisher's own."""
        self.js = js
        self.host_name = host_name
        self.key = key if key is not None else random_key()
        self.report = PublishReport()

    async def _one(self, subject: str, payload: bytes, digest: str) -> None:
        ident = message_id(self.key, digest)
        for attempt in range(ATTEMPTS):
            try:
                await self.js.publish(
                    subject,
                    payload,
                    timeout=API_TIMEOUT_S,
                    stream=EVENTS_STREAM,
                    headers={"Nats-Msg-Id": ident},
                )
                self.report.published += 1
                return
            except (NatsError, APIError, TimeoutError) as exc:
                denied = refusal(self.js._nc, subject)
                self.report.last_error = denied or f"{type(exc).__name__}: {exc}"
                if denied:
                    break  # refused for good: the retries are for a leader election
                await asyncio.sleep(0.5 * (attempt + 1))
        self.report.failed += 1

    async def publish(self, events: Iterable[Event]) -> PublishReport:
        pending: list[asyncio.Task[None]] = []
        for event in events:
            pending.append(asyncio.ensure_future(self._one(*encode(event, self.host_name))))
            if len(pending) >= IN_FLIGHT:
                await asyncio.gather(*pending)
                pending = []
        if pending:
            await asyncio.gather(*pending)
        return self.report


def decode(payload: bytes) -> object:
    """The event of a message, or raises ValueError (hostile nodes send anything)."""
    try:
        return orjson.loads(payload)
    except orjson.JSONDecodeError as exc:
        raise ValueError(f"not JSON: {exc}") from None

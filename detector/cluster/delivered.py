"""Alert ids already delivered by any hub member, kept in the JetStream key-value bucket
HPCSEC_ALERTS, so a member that replays events after a restart does not send them twice.

The bucket is replicated like the events stream. When the server holding its leader dies,
the bucket does not answer until the other servers elect a new leader (seconds): the hub
must go on evaluating meanwhile. A lookup that gets no answer counts the alert as not yet
delivered (it is sent, with its stable `alert.id`, for receivers to deduplicate: at least
once rather than never); ids delivered meanwhile are written once the bucket answers again.
While the bucket is away it is asked again only every RETRY_S, so a failover costs the hub
one short timeout, not one per alert.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

from nats.aio.client import Client
from nats.errors import Error as NatsError
from nats.js.errors import APIError, KeyNotFoundError
from nats.js.kv import KeyValue

from hpcsec.detector.cluster.streams import ALERTS_BUCKET, StreamSettings
from hpcsec.detector.core.log import get_logger

KV_TIMEOUT_S = 2.0  # a bucket electing its leader does not answer: do not wait the API's 10 s
RETRY_S = 2.0
MAX_UNRECORDED = 100_000  # ids kept for writing later; beyond, the oldest are only in memory

logger = get_logger(__name__)


class DeliveredAlerts:
    def __init__(self, kv: KeyValue, monotonic: Callable[[], float] = time.monotonic):
        self.kv = kv
        self.local: set[str] = set()
        self.unrecorded: dict[str, bytes] = {}  # delivered while the bucket did not answer
        self._monotonic = monotonic
        self._away_until = -math.inf
        self._outage = False  # logged once per outage

    @classmethod
    async def open(cls, nc: Client, replicas: int, settings: StreamSettings) -> DeliveredAlerts:
        js = nc.jetstream(timeout=KV_TIMEOUT_S)  # every call on the bucket waits this long
        try:
            kv = await js.create_key_value(
                bucket=ALERTS_BUCKET, ttl=settings.alert_memory_s, replicas=replicas
            )
        except APIError:  # exists with other settings: use it as it is
            kv = await js.key_value(ALERTS_BUCKET)
        return cls(kv)

    @property
    def away(self) -> bool:
        """The bucket did not answer lately: it is not asked again before RETRY_S."""
        return self._monotonic() < self._away_until

    def _lost(self, exc: Exception) -> None:
        if not self._outage:
            logger.warning(
                "hub: the delivered-alerts bucket does not answer (%s); alerts are sent and "
                "recorded once it answers again",
                str(exc) or type(exc).__name__,
            )
        self._outage = True
        self._away_until = self._monotonic() + RETRY_S

    def _answered(self) -> None:
        if self._outage:
            logger.info("hub: the delivered-alerts bucket answers again")
        self._outage = False

    async def seen(self, alert_id: str) -> bool:
        if alert_id in self.local:
            return True
        if self.away or not await self._write_unrecorded():
            return False
        try:
            await self.kv.get(alert_id)
        except KeyNotFoundError:
            self._answered()
            return False
        except (NatsError, TimeoutError) as exc:
            self._lost(exc)
            return False
        self._answered()
        self.local.add(alert_id)
        return True

    async def mark(self, alert_id: str) -> None:
        self.local.add(alert_id)
        self.unrecorded[alert_id] = str(time.time()).encode()
        if len(self.unrecorded) > MAX_UNRECORDED:
            del self.unrecorded[next(iter(self.unrecorded))]
        if not self.away:
            await self._write_unrecorded()

    async def _write_unrecorded(self) -> bool:
        """Writes the ids waiting for the bucket, oldest first; False when it did not answer."""
        while self.unrecorded:
            alert_id, value = next(iter(self.unrecorded.items()))
            try:
                await self.kv.put(alert_id, value)
            except (NatsError, TimeoutError) as exc:  # the alert went out; a replay may resend it
                self._lost(exc)
                return False
            del self.unrecorded[alert_id]
            self._answered()
        return True

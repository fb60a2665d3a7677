"""The JetStream streams hpcsec uses: the hub sets them up, nodes publish into them.

Events: stream HPCSEC_EVENTS, subjects `hpcsec.events.p<NN>.<host>` (NN the partition, see
partition.py). Retention by limits: a day of events or 8 GiB, oldest dropped first; a hub
that was down longer than that resumes at the oldest event still kept. Replicas: 3 where the
server is part of a JetStream cluster, else 1 (a single server cannot replicate).

Delivered alerts: key-value bucket HPCSEC_ALERTS (alert id -> time it was delivered), so a
hub member that replays events after a crash does not send the same alert twice.

Who may do what (docs/cluster.md, "Permissions"; examples/nats-node-permissions.conf): the
hub creates the streams and brings their limits up to date; a node's NATS user may only
publish its own subjects and ask whether JetStream and the streams are there, so that a
compromised node cannot delete, purge or reshape them. A node therefore never changes a
stream, creates a missing one only where its user may (a server without authorization), and
answers on an inbox prefix of its own (NODE_INBOX_PREFIX): a node allowed to subscribe to
`_INBOX.>` would receive every message the hub fetches from the stream, since pull consumers
deliver to the fetching client's inbox.
"""

from __future__ import annotations

import asyncio
import logging
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from nats.aio.client import Client
from nats.aio.client import Client as NATS
from nats.errors import Error as NatsError
from nats.errors import NoRespondersError
from nats.js import JetStreamContext
from nats.js.api import DiscardPolicy, RetentionPolicy, StorageType, StreamConfig
from nats.js.errors import APIError, NotFoundError, ServiceUnavailableError

from hpcsec.detector.core.errors import HpcsecError
from hpcsec.detector.core.log import get_logger

EVENTS_STREAM = "HPCSEC_EVENTS"
EVENTS_SUBJECT_PREFIX = "hpcsec.events"
ALERTS_BUCKET = "HPCSEC_ALERTS"
# The alerts agents raise on their own nodes (`hpcsec agent --nats`), for a SOC to consume:
NODE_ALERTS_STREAM = "HPCSEC_NODE_ALERTS"
NODE_ALERTS_SUBJECT_PREFIX = "hpcsec.alerts"
NODE_ALERTS_DUPLICATE_WINDOW_S = 3600.0  # alerts are few: an agent's resend after a long
#                                          outage with a lost ack is still stored once
CONNECT_TIMEOUT_S = 5
FIRST_CONNECT_S = 10.0
JETSTREAM_WAIT_S = 20.0
# The client logs a traceback for every failed connection attempt; connect() reports
# failures itself, once.
logging.getLogger("nats.aio.client").setLevel(logging.CRITICAL)
logger = get_logger(__name__)
API_TIMEOUT_S = 10.0
NODE_INBOX_PREFIX = "_INBOX_HPCSEC_NODE"  # what a node's user may subscribe to (with `.>`)
PERMISSIONS_VIOLATION = "permissions violation"
# What the server refused each client (connect's error callback): nats-py keeps only a
# client's last error, and many publishes are in flight at once.
_refusals: weakref.WeakKeyDictionary[Client, set[str]] = weakref.WeakKeyDictionary()


class ClusterError(HpcsecError):
    """NATS unreachable, JetStream missing, or a stream that cannot be set up."""


@dataclass(frozen=True)
class StreamSettings:
    max_age_s: float = 24 * 3600.0
    max_bytes: int = 8 * 1024**3
    replicas: int = 3  # lowered to 1 on a server outside a JetStream cluster
    duplicate_window_s: float = 120.0  # a publisher's retry of one event is stored once
    alert_memory_s: float = 7 * 24 * 3600.0  # how long a delivered alert id is remembered


def events_config(settings: StreamSettings, replicas: int) -> StreamConfig:
    return StreamConfig(
        name=EVENTS_STREAM,
        description="hpcsec node events, partitioned for the hub members",
        subjects=[f"{EVENTS_SUBJECT_PREFIX}.>"],
        retention=RetentionPolicy.LIMITS,
        max_age=settings.max_age_s,
        max_bytes=settings.max_bytes,
        discard=DiscardPolicy.OLD,
        storage=StorageType.FILE,
        num_replicas=replicas,
        duplicate_window=settings.duplicate_window_s,
    )


def node_alerts_config(settings: StreamSettings, replicas: int) -> StreamConfig:
    return StreamConfig(
        name=NODE_ALERTS_STREAM,
        description="alerts raised by hpcsec agents on their nodes",
        subjects=[f"{NODE_ALERTS_SUBJECT_PREFIX}.>"],
        retention=RetentionPolicy.LIMITS,
        max_age=settings.alert_memory_s,
        max_bytes=settings.max_bytes,
        discard=DiscardPolicy.OLD,
        storage=StorageType.FILE,
        num_replicas=replicas,
        duplicate_window=NODE_ALERTS_DUPLICATE_WINDOW_S,
    )


async def connect(
    urls: list[str], *, reconnect: bool = True, inbox_prefix: str = "_INBOX"
) -> Client:
    """A connection that keeps reconnecting (to any server of the cluster) once it is up;
    the first connection fails within FIRST_CONNECT_S with a ClusterError. Nodes pass
    NODE_INBOX_PREFIX: the answers to their requests come there."""

    async def quiet(exc: Exception) -> None:  # the client retries; callers see the outcome
        text = str(exc).removeprefix("nats: ")
        if text.startswith(PERMISSIONS_VIOLATION):
            _refusals.setdefault(client, set()).add(text)

    async def disconnected() -> None:
        if not client.is_closed:  # not our own close()
            logger.warning("NATS connection lost, reconnecting")

    async def reconnected() -> None:
        logger.info("NATS connection re-established")

    client = NATS()
    try:
        await asyncio.wait_for(
            client.connect(
                servers=urls,
                connect_timeout=CONNECT_TIMEOUT_S,
                allow_reconnect=reconnect,
                max_reconnect_attempts=-1 if reconnect else 0,
                reconnect_time_wait=1,
                error_cb=quiet,
                disconnected_cb=disconnected,
                reconnected_cb=reconnected,
                inbox_prefix=inbox_prefix,
            ),
            FIRST_CONNECT_S,
        )
        return client
    except (OSError, NatsError, TimeoutError) as exc:
        reason = str(exc) or type(exc).__name__
        raise ClusterError(f"cannot connect to NATS at {', '.join(urls)}: {reason}") from None


def refusal(nc: Client, subject: str) -> str | None:
    """The server's refusal of this client's publish to `subject`, or of one of its
    subscriptions (a client subscribes to its inbox for every answer), if it sent one: the
    server drops what a user may not publish with an -ERR (which nats-py hands to the error
    callback, lowercased), and the request itself just times out."""
    for text in _refusals.get(nc, ()):
        if f'"{subject.lower()}"' in text or text.startswith(f"{PERMISSIONS_VIOLATION} for sub"):
            return text
    return None


def refusals(nc: Client) -> list[str]:
    """Everything the server refused this client so far, sorted (for an error message)."""
    return sorted(_refusals.get(nc, ()))


def _refused(nc: Client, subject: str) -> ClusterError | None:
    denied = refusal(nc, subject)
    if denied is None:
        return None
    return ClusterError(
        f"NATS refused this client's user: {denied} (the permissions a node and a hub need "
        "are in docs/cluster.md, Permissions)"
    )


async def require_jetstream(nc: Client, url: str) -> None:
    """A clear error for a server without JetStream; a cluster electing its JetStream leader
    (a server just died) is waited for, up to JETSTREAM_WAIT_S."""
    # The server's INFO says whether it runs JetStream (nats-py keeps it, unexported); the
    # API alone cannot tell "no JetStream" from "a cluster electing its leader".
    if not nc._server_info.get("jetstream"):
        raise ClusterError(
            f"the NATS server at {url} has no JetStream (start it with -js or a jetstream {{}} "
            "block); hpcsec needs JetStream for durable, replayable events"
        )
    js = nc.jetstream()
    deadline = time.monotonic() + JETSTREAM_WAIT_S
    while True:
        try:
            await js.account_info()
            return
        except (NoRespondersError, ServiceUnavailableError, NotFoundError, NatsError) as exc:
            problem = str(exc) or type(exc).__name__
        except TimeoutError as exc:
            problem = str(exc) or "timeout"
        refused = _refused(nc, "$JS.API.INFO")
        if refused is not None:
            raise refused
        if time.monotonic() >= deadline:
            raise ClusterError(f"JetStream at {url} does not answer: {problem}")
        await asyncio.sleep(0.5)


async def _stream_info(js: JetStreamContext, name: str) -> Any:
    """The stream's info, None when it does not exist; a cluster electing a new leader (a
    server just died) is waited for up to JETSTREAM_WAIT_S, as `require_jetstream` does."""
    deadline = time.monotonic() + JETSTREAM_WAIT_S
    while True:
        try:
            return await js.stream_info(name)
        except NotFoundError:
            return None
        except (NoRespondersError, ServiceUnavailableError, TimeoutError) as exc:
            problem = str(exc) or type(exc).__name__
        refused = _refused(js._nc, f"$JS.API.STREAM.INFO.{name}")
        if refused is not None:
            raise refused
        if time.monotonic() >= deadline:
            raise ClusterError(f"JetStream does not answer for stream {name}: {problem}")
        await asyncio.sleep(0.5)


async def ensure_events_stream(js: JetStreamContext, settings: StreamSettings) -> int:
    """The hub's side: create the events stream or bring its limits up to date; returns its
    replica count."""
    info = await _stream_info(js, EVENTS_STREAM)
    if info is not None:
        replicas = info.config.num_replicas or 1  # changing replicas is an operator's move
        wanted = events_config(settings, replicas)
        current = info.config
        if (current.max_age, current.max_bytes, current.duplicate_window) != (
            wanted.max_age,
            wanted.max_bytes,
            wanted.duplicate_window,
        ):
            await _api(js.update_stream(wanted), "update stream")
        return replicas
    created = await _add_stream(js, EVENTS_STREAM, lambda n: events_config(settings, n), settings)
    # another node created it meanwhile: take its replicas and bring its limits up to date
    return created if created is not None else await ensure_events_stream(js, settings)


async def ensure_alerts_stream(js: JetStreamContext, settings: StreamSettings) -> None:
    """Create the node alerts stream where it is missing (same replicas as the events)."""
    if await _stream_info(js, NODE_ALERTS_STREAM) is not None:
        return
    await _add_stream(js, NODE_ALERTS_STREAM, lambda n: node_alerts_config(settings, n), settings)


async def ensure_node_stream(nc: Client, name: str) -> None:
    """A node's side of stream `name` (EVENTS_STREAM or NODE_ALERTS_STREAM): used as the hub
    or an operator set it up, never changed (its limits are theirs). A missing stream is
    created with the defaults where the node's user may (a server without authorization);
    with the node permissions it may not, and the error says who creates it."""
    js = nc.jetstream()
    if await _stream_info(js, name) is not None:
        return
    settings = StreamSettings()
    config = events_config if name == EVENTS_STREAM else node_alerts_config
    try:
        await _add_stream(js, name, lambda n: config(settings, n), settings)
    except (ClusterError, TimeoutError) as exc:
        denied = refusal(nc, f"$JS.API.STREAM.CREATE.{name}")
        if denied is not None:
            raise ClusterError(
                f"stream {name} does not exist and this node's NATS user may not create it "
                f"({denied}): the hub creates the streams when it starts, or an operator "
                "does (docs/cluster.md, Permissions)"
            ) from None
        if isinstance(exc, ClusterError):
            raise
        raise ClusterError(f"JetStream did not answer creating stream {name}") from None


async def _add_stream(
    js: JetStreamContext,
    name: str,
    config: Callable[[int], StreamConfig],
    settings: StreamSettings,
) -> int | None:
    """Create stream `name` with the configured replicas, or one copy on a server outside a
    JetStream cluster (it refuses replicas); the replica count, or None when another node
    created the stream meanwhile."""
    for replicas in dict.fromkeys((settings.replicas, 1)):
        try:
            await js.add_stream(config(replicas))
            return replicas
        except APIError as exc:
            if "already in use" in str(exc).lower():
                return None
            if replicas == 1:
                raise ClusterError(f"cannot create stream {name}: {exc}") from None
    raise ClusterError(f"cannot create stream {name}")  # not reached: replicas 1 raises


async def _api(call: object, what: str) -> object:
    try:
        return await call  # type: ignore[misc]
    except (APIError, TimeoutError) as exc:
        raise ClusterError(f"JetStream refused to {what}: {exc}") from None

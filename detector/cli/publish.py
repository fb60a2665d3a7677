"""`hpcsec publish`: a node's events (an events file or a snapshot) to the cluster's hubs."""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Iterator
from pathlib import Path

from hpcsec.detector.cluster.msgid import MessageKeyError, message_key, random_key
from hpcsec.detector.cluster.publisher import Publisher, PublishReport
from hpcsec.detector.cluster.streams import (
    EVENTS_STREAM,
    NODE_INBOX_PREFIX,
    connect,
    ensure_node_stream,
    require_jetstream,
)
from hpcsec.detector.config.site import SiteConfig, load_config
from hpcsec.detector.enrich.enricher import Enricher
from hpcsec.detector.outputs.registry import default_spool_dir
from hpcsec.detector.runtime.pipeline import SourceBatch, enrich
from hpcsec.detector.runtime.sources import EventSources, ScanReport

BATCH = 256
EXIT_OK, EXIT_ERROR = 0, 2


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "publish",
        help="publish a node's events (events file or snapshot) to NATS JetStream for the hubs",
    )
    p.add_argument(
        "--nats",
        action="append",
        required=True,
        metavar="URL",
        help="NATS server, e.g. nats://hub1:4222 (repeatable: servers of one cluster)",
    )
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--events", metavar="FILE|-", help="JSONL events")
    src.add_argument("--snapshot", metavar="DIR", help="a node snapshot (read as scan does)")
    p.add_argument("--host-name", metavar="NAME", help="set host.name of every event")
    p.add_argument("--config", metavar="FILE", help="site config used for the enrichment")
    p.add_argument(
        "--spool",
        metavar="DIR",
        help="the node's spool directory, where its NATS message-id key is kept (the agent's "
        "too); default: spool.dir of the config, else the default spool directory",
    )
    p.set_defaults(func=run)


def node_key(args: argparse.Namespace, config: SiteConfig) -> bytes:
    """The node's message-id key, in the spool directory where `hpcsec agent --nats` keeps
    it, so that a node has one key. A directory given that cannot be used is an error; where
    the default one cannot be, this run makes a key of its own: a retry within the run is
    still stored once, a second run within the duplicate window may store its events again."""
    chosen = args.spool or config.spool_dir
    if chosen:
        return message_key(Path(chosen))
    try:
        return message_key(Path(default_spool_dir()))
    except MessageKeyError as exc:
        print(f"hpcsec: note: {exc}; this run uses a key of its own", file=sys.stderr)
        return random_key()


def run(args: argparse.Namespace) -> int:
    config = load_config(args.config)
    key = node_key(args, config)
    report = ScanReport()
    sources = EventSources(config, report)
    if args.events:
        batches = sources.from_events_file(args.events, BATCH)
    else:
        batches = sources.from_snapshot(args.snapshot)
    enricher = Enricher(config)  # the node's job context, as scan would add it
    result = asyncio.run(publish(args.nats, batches, enricher, args.host_name, key))
    report.print(sys.stderr)
    print(f"hpcsec: published {result.published} event(s)", file=sys.stderr)
    if result.failed:
        print(
            f"hpcsec: error: {result.failed} event(s) not acknowledged by JetStream "
            f"({result.last_error})",
            file=sys.stderr,
        )
        return EXIT_ERROR
    return EXIT_OK


async def publish(
    urls: list[str],
    batches: Iterator[SourceBatch],
    enricher: Enricher,
    host_name: str | None,
    key: bytes,
) -> PublishReport:
    """Scan's sources (detector/runtime/sources.py), enriched as scan enriches them, each
    batch published and acknowledged before the next is read. The stream is the hub's: a
    node uses it as it is (streams.ensure_node_stream)."""
    nc = await connect(urls, inbox_prefix=NODE_INBOX_PREFIX)
    try:
        await require_jetstream(nc, urls[0])
        await ensure_node_stream(nc, EVENTS_STREAM)
        publisher = Publisher(nc.jetstream(), host_name, key)
        for batch in batches:
            await publisher.publish(enrich(enricher, batch))
        return publisher.report
    finally:
        await nc.close()

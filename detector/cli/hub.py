"""`hpcsec hub`: evaluate every node's events, published to NATS JetStream, fleet-wide."""

from __future__ import annotations

import argparse
import asyncio
import sys

from hpcsec.detector.cli.common import add_config_and_rules, add_outputs
from hpcsec.detector.cluster.evaluation import HubClock, HubEvaluation
from hpcsec.detector.cluster.hub import Hub, HubSetup
from hpcsec.detector.cluster.partition import PARTITIONS, member_partitions, parse_member
from hpcsec.detector.cluster.streams import StreamSettings
from hpcsec.detector.config.site import load_config
from hpcsec.detector.engine import thresholds
from hpcsec.detector.runtime.endpoints import open_alert_outputs, open_store_journal
from hpcsec.detector.runtime.metrics import AgentMetrics
from hpcsec.detector.runtime.sink import AlertSink


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "hub",
        help="consume the events of all nodes from NATS JetStream and evaluate the rules "
        "across nodes (correlations span the fleet)",
    )
    p.add_argument(
        "--nats",
        action="append",
        required=True,
        metavar="URL",
        help="NATS server, e.g. nats://hub1:4222 (repeatable: servers of one cluster)",
    )
    add_config_and_rules(p)
    add_outputs(p, store_help="DuckDB alert and event store")
    p.add_argument(
        "--member",
        metavar="I/N",
        help=f"this process is member I of N hubs sharing the work (N <= {PARTITIONS}); "
        "restart a member with the same I/N",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    member = parse_member(args.member)
    config = load_config(args.config)
    clock = HubClock(sources=member_partitions(*member))
    evaluation = HubEvaluation.load(
        config, args.rules, clock=clock, default_rules=not args.no_default_rules
    )
    for name in thresholds.unused(config.thresholds, evaluation.pipeline.ruleset.rules):
        print(f"hpcsec: warning: threshold {name!r} of the config is not used", file=sys.stderr)
    outputs = open_alert_outputs(
        tuple(args.output or ()),
        secret_file=args.webhook_secret_file,
        spool_dir=args.spool,
        config=config,
        fallback="-",  # like the agent: with no output configured, alerts go to stdout
    )
    store = None
    try:
        store = open_store_journal(args.store or config.store_path, config.retention_days)
        sink = AlertSink(outputs, store, AgentMetrics(), track_lost=True)
        setup = HubSetup(list(args.nats), member, StreamSettings())
        return asyncio.run(Hub(setup, evaluation, sink).run())
    finally:
        if outputs is not None:
            outputs.close()
        if store is not None:
            store.close()

"""`hpcsec hub`: evaluate every node's events, published to NATS JetStream, fleet-wide."""

from __future__ import annotations

import argparse
import asyncio
import sys

from hpcsec.detector.alerts.suppression import Suppressor
from hpcsec.detector.cli.common import add_config_and_rules, add_outputs
from hpcsec.detector.cluster.evaluation import ClusterEvaluator
from hpcsec.detector.cluster.hub import Hub, HubSetup
from hpcsec.detector.cluster.partition import PARTITIONS, parse_member
from hpcsec.detector.cluster.streams import StreamSettings
from hpcsec.detector.config.site import load_config
from hpcsec.detector.engine import thresholds
from hpcsec.detector.engine.evaluate import Engine
from hpcsec.detector.engine.loader import load_rules
from hpcsec.detector.runtime.metrics import AgentMetrics
from hpcsec.detector.runtime.sink import AlertSink, open_alert_outputs, open_alert_store


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
    ruleset = load_rules(args.rules, with_tests=False, threshold_values=config.thresholds)
    for name in thresholds.unused(config.thresholds, ruleset.rules):
        print(f"hpcsec: warning: threshold {name!r} of the config is not used", file=sys.stderr)
    engine = Engine(ruleset, placeholders=config.placeholders())
    outputs = open_alert_outputs(
        tuple(args.output or config.outputs), args.webhook_secret_file, args.spool, config
    )
    try:
        store = open_alert_store(args.store or config.store_path, config.retention_days)
        sink = AlertSink(Suppressor.from_config(config), outputs, store, AgentMetrics())
        setup = HubSetup(list(args.nats), member, StreamSettings())
        return asyncio.run(Hub(setup, ClusterEvaluator(config, engine), sink).run())
    finally:
        outputs.close()

"""`hpcsec scan`: sensors once (or a snapshot, or an events file), rules, alerts out."""

from __future__ import annotations

import argparse
import os
import sys

from hpcsec.detector.alerts.builder import AlertBuilder, level_rank, sort_alerts
from hpcsec.detector.cli.common import add_config_and_rules, add_outputs, add_roots
from hpcsec.detector.cli.render import write_json, write_jsonl, write_table
from hpcsec.detector.config.site import SiteConfig, load_config
from hpcsec.detector.core.errors import UsageError
from hpcsec.detector.core.schema import LEVELS
from hpcsec.detector.engine import thresholds
from hpcsec.detector.engine.evaluate import Engine
from hpcsec.detector.engine.loader import load_rules
from hpcsec.detector.outputs.delivery import OutputSet
from hpcsec.detector.runtime.delivery import (
    deliver_alerts,
    open_scan_outputs,
    open_store,
    store_decision,
    suppress,
)
from hpcsec.detector.runtime.sources import EventSources, ScanReport, demo_snapshot_dir

BATCH = 256  # small batches stay in the CPU cache (bench/engine.py measures it)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "scan",
        help="run sensors once (or read a snapshot/events), "
        "evaluate the rules, print or send alerts",
    )
    src = p.add_mutually_exclusive_group()
    src.add_argument("--events", metavar="FILE|-", help="JSONL events instead of sensors")
    src.add_argument("--snapshot", metavar="DIR", help="replay a node snapshot")
    src.add_argument("--demo", action="store_true", help="scan the bundled demo snapshot")
    add_config_and_rules(p)
    p.add_argument("--format", choices=("table", "json", "jsonl"), default="table")
    p.add_argument(
        "--fail-on",
        choices=LEVELS,
        default=LEVELS[0],
        metavar="LEVEL",
        help="exit 1 when an alert at or above LEVEL is raised "
        f"({', '.join(LEVELS)}; default {LEVELS[0]})",
    )
    p.add_argument("--no-dedup", action="store_true", help="every match is an alert")
    add_outputs(p, store_help="also keep the events and alerts in this DuckDB file")
    p.add_argument("--sensor", action="append", metavar="NAME", help="live scan: sensors to run")
    p.add_argument(
        "--pcap", metavar="FILE", help="live scan: also evaluate the RoCE v2 flows of this capture"
    )
    p.add_argument(
        "--interface",
        metavar="IFACE",
        help="live scan: also sniff RoCE v2 on IFACE (a mirror port) for --duration",
    )
    p.add_argument(
        "--duration",
        type=float,
        default=None,
        metavar="S",
        help="seconds to sniff --interface (default 10)",
    )
    add_roots(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    config_path = args.config
    if args.demo and not config_path:  # the demo node's own policy (assets, baselines, admins)
        config_path = str(demo_snapshot_dir() / "site-config.yml")
    config = load_config(config_path)
    # without test events: a slip in a tests file must not stop detection
    ruleset = load_rules(args.rules, with_tests=False, threshold_values=config.thresholds)
    for name in thresholds.unused(config.thresholds, ruleset.rules):
        print(
            f"hpcsec: warning: threshold {name!r} of the config is not used by any rule",
            file=sys.stderr,
        )
    engine = Engine(ruleset, placeholders=config.placeholders())
    outputs = open_scan_outputs(list(args.output or config.outputs), args, config)
    try:
        return scan(args, config, engine, outputs)
    finally:
        if outputs is not None:
            outputs.close()


def scan(
    args: argparse.Namespace, config: SiteConfig, engine: Engine, outputs: OutputSet | None
) -> int:
    builder = AlertBuilder(dedup=not args.no_dedup, window_s=config.dedup_window_s)
    report = ScanReport()
    sources = EventSources(config, report)
    if (args.pcap or args.interface) and (args.events or args.snapshot or args.demo):
        raise UsageError("--pcap and --interface go with a live scan, not --events/--snapshot")
    if args.pcap and not os.path.isfile(args.pcap):
        raise UsageError(f"--pcap {args.pcap}: no such file")
    if args.events:
        batches = sources.from_events_file(args.events, BATCH)
    elif args.snapshot or args.demo:
        batches = sources.from_snapshot(args.snapshot, demo=args.demo)
    else:
        batches = sources.live(args)
    store = open_store(args.store or config.store_path, config)
    for batch in batches:
        builder.add(engine.evaluate(batch))
        if store is not None:
            store.insert_events(batch)
    builder.add(engine.flush())
    report.print(sys.stderr)
    decision = suppress(sort_alerts(builder.alerts()), config)
    alerts = decision.send
    delivery = None
    if outputs is not None:
        delivery = deliver_alerts(outputs, alerts)
    else:
        write_alerts(alerts, args.format)
    store_decision(store, decision, delivery)
    threshold = level_rank(args.fail_on)
    return 1 if any(level_rank(a["rule.level"]) >= threshold for a in alerts) else 0


def write_alerts(alerts: list[dict], fmt: str) -> None:
    if fmt == "json":
        write_json(alerts)
    elif fmt == "jsonl":
        write_jsonl(alerts)
    else:
        write_table(alerts, title=f"hpcsec: {len(alerts)} alert(s)")

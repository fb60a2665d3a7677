"""`hpcsec agent`: sensors every interval and the fanotify stream, rules, alerts out, until
SIGTERM. SIGHUP reloads the rules and the config. See docs/agent.md."""

from __future__ import annotations

import argparse
from pathlib import Path

from hpcsec.detector.cli.common import add_config_and_rules, add_outputs, add_roots
from hpcsec.detector.cluster.agent_tap import NatsTap
from hpcsec.detector.config.site import load_config
from hpcsec.detector.core.errors import UsageError
from hpcsec.detector.core.schema import LEVELS


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be positive: {text!r}")
    return value


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "agent",
        help="run continuously on a node: sampled sensors, the file "
        "access stream, rules, alerts to outputs and the store; SIGHUP reloads",
    )
    add_config_and_rules(p)
    add_outputs(p, store_help="DuckDB alert and event store")
    p.add_argument(
        "--interval",
        type=_seconds,
        metavar="S",
        help="seconds between samples (default: agent.interval_s, 10)",
    )
    p.add_argument(
        "--metrics-address",
        metavar="HOST:PORT",
        help="Prometheus metrics (default: agent.metrics_address, 127.0.0.1:9817; "
        "port 0 picks a free port, printed at start)",
    )
    p.add_argument(
        "--sensor",
        action="append",
        metavar="NAME",
        help="sensors to run (repeatable; default: all enabled ones)",
    )
    add_roots(p)
    p.add_argument(
        "--drain-timeout",
        type=_seconds,
        default=10.0,
        metavar="S",
        help="at exit, how long to keep trying to deliver spooled alerts (10)",
    )
    p.add_argument(
        "--once-for",
        type=_seconds,
        metavar="S",
        help="run S seconds, then drain and exit (tests, benchmarks)",
    )
    p.add_argument(
        "--nats",
        action="append",
        metavar="URL",
        help="also publish alerts and edge-filtered events to NATS JetStream (repeatable; "
        "default: cluster.nats of the config; see docs/cluster.md)",
    )
    p.add_argument(
        "--min-level",
        choices=LEVELS,
        default=LEVELS[0],
        metavar="LEVEL",
        help="send only alerts at or above LEVEL; the others are stored only "
        f"({', '.join(LEVELS)}; default {LEVELS[0]})",
    )
    p.set_defaults(func=run)


def _nats_tap(args: argparse.Namespace) -> NatsTap | None:
    """The cluster publisher when NATS URLs are given; its spool sits in the spool dir."""
    config = load_config(args.config)
    urls = list(args.nats or config.cluster_nats)
    if not urls:
        return None
    spool = args.spool or config.spool_dir
    if not spool:
        raise UsageError(
            "publishing to NATS needs a spool directory (--spool or spool.dir in the config)"
        )
    return NatsTap(urls, Path(spool), config.spool_max_bytes)


def run(args: argparse.Namespace) -> int:
    from hpcsec.detector.runtime.agent import AgentSettings, run_agent

    tap = _nats_tap(args)
    settings = AgentSettings(
        config_path=args.config,
        rule_paths=tuple(args.rules) if args.rules else None,
        default_rules=not args.no_default_rules,
        outputs=tuple(args.output or ()),
        secret_file=args.webhook_secret_file,
        spool_dir=args.spool,
        store_path=args.store,
        interval_s=args.interval,
        metrics_address=args.metrics_address,
        sysfs_root=args.sysfs_root,
        procfs_root=args.procfs_root,
        etc_root=args.etc_root,
        sensors=tuple(args.sensor) if args.sensor else None,
        once_for_s=args.once_for,
        drain_timeout_s=args.drain_timeout,
        min_level=args.min_level,
    )
    try:
        return run_agent(settings, tap)
    finally:
        if tap is not None:
            tap.close(0)  # after a failed start; a clean stop has closed it already

"""`hpcsec agent`: sensors every interval and the fanotify stream, rules, alerts out, until
SIGTERM. SIGHUP reloads the rules and the config. See docs/agent.md."""

from __future__ import annotations

import argparse

from hpcsec.detector.cli.common import add_config_and_rules, add_outputs, add_roots
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
        "--min-level",
        choices=LEVELS,
        default=LEVELS[0],
        metavar="LEVEL",
        help="send only alerts at or above LEVEL; the others are stored only "
        f"({', '.join(LEVELS)}; default {LEVELS[0]})",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from hpcsec.detector.runtime.agent import AgentSettings, run_agent

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
    return run_agent(settings)

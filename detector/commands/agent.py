"""`hpcsec agent`: sensors every interval and the fanotify stream, rules, alerts out, until
SIGTERM. SIGHUP reloads the rules and the config. See docs/agent.md."""

from __future__ import annotations

import argparse


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be positive: {text!r}")
    return value


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("agent", help="run continuously on a node: sampled sensors, the file "
                       "access stream, rules, alerts to outputs and the store; SIGHUP reloads")
    p.add_argument("--config", metavar="FILE", help="site config (YAML)")
    p.add_argument("--rules", action="append", metavar="DIR|FILE",
                   help="rule file or directory (repeatable; default: the bundled rules)")
    p.add_argument("--output", action="append", metavar="URL",
                   help="send alerts: syslog+udp|tcp|tls://HOST:PORT, http(s)://… webhook, "
                   "file:///PATH.jsonl, - (repeatable; default: the config's outputs)")
    p.add_argument("--webhook-secret-file", metavar="FILE")
    p.add_argument("--spool", metavar="DIR", help="durable spool for undelivered alerts")
    p.add_argument("--store", metavar="FILE", help="DuckDB alert and event store")
    p.add_argument("--interval", type=_seconds, metavar="S",
                   help="seconds between samples (default: agent.interval_s, 10)")
    p.add_argument("--metrics-address", metavar="HOST:PORT",
                   help="Prometheus metrics (default: agent.metrics_address, 127.0.0.1:9817; "
                   "port 0 picks a free port, printed at start)")
    p.add_argument("--sensor", action="append", metavar="NAME",
                   help="sensors to run (repeatable; default: all enabled ones)")
    p.add_argument("--sysfs-root", default="/sys", metavar="DIR")
    p.add_argument("--procfs-root", default="/proc", metavar="DIR")
    p.add_argument("--etc-root", default="/etc", metavar="DIR")
    p.add_argument("--drain-timeout", type=_seconds, default=10.0, metavar="S",
                   help="at exit, how long to keep trying to deliver spooled alerts (10)")
    p.add_argument("--once-for", type=_seconds, metavar="S",
                   help="run S seconds, then drain and exit (tests, benchmarks)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ..agent import AgentSettings, run_agent

    settings = AgentSettings(
        config_path=args.config,
        rule_paths=tuple(args.rules) if args.rules else None,
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
    )
    return run_agent(settings)

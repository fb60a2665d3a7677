"""Options several sub-commands share, defined once so they read the same everywhere."""

from __future__ import annotations

import argparse


def add_config_and_rules(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", metavar="FILE", help="site config (YAML)")
    p.add_argument(
        "--rules",
        action="append",
        metavar="DIR|FILE",
        help="local rule file or directory, loaded beside the bundled rules and the "
        "config's `rules:` (repeatable)",
    )
    p.add_argument(
        "--no-default-rules",
        action="store_true",
        help="do not load the bundled rules: only the config's `rules:` and --rules",
    )


def add_outputs(p: argparse.ArgumentParser, store_help: str) -> None:
    p.add_argument(
        "--output",
        action="append",
        metavar="URL",
        help="send alerts: syslog+udp|tcp|tls://HOST:PORT, http(s)://… webhook, "
        "file:///PATH.jsonl, - (repeatable; default: the config's outputs)",
    )
    p.add_argument(
        "--webhook-secret-file",
        metavar="FILE",
        help="file with the HMAC secret that signs webhook posts",
    )
    p.add_argument("--spool", metavar="DIR", help="durable spool for undelivered alerts")
    p.add_argument("--store", metavar="FILE", help=store_help)


def add_roots(p: argparse.ArgumentParser) -> None:
    """Where the sensors read the node: tests and replays point these at other trees."""
    p.add_argument(
        "--sysfs-root",
        default="/sys",
        metavar="DIR",
        help="directory that holds class/… (default /sys)",
    )
    p.add_argument("--procfs-root", default="/proc", metavar="DIR", help="default /proc")
    p.add_argument(
        "--etc-root",
        default="/etc",
        metavar="DIR",
        help="directory with passwd, group and hosts (default /etc)",
    )

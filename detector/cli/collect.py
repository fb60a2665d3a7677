"""`hpcsec collect`: run sensors once and print their events (or write a node snapshot)."""

from __future__ import annotations

import argparse
import os
import socket
import sys
from typing import Any

from hpcsec.detector.cli.common import add_roots
from hpcsec.detector.config.site import SiteConfig, load_config
from hpcsec.detector.core.display import visible, visible_json
from hpcsec.detector.core.errors import HpcsecError, UsageError
from hpcsec.detector.core.jsonenc import dumps
from hpcsec.detector.core.schema import Event
from hpcsec.detector.enrich.enricher import Enricher
from hpcsec.detector.runtime import registry
from hpcsec.detector.runtime.node import live_context
from hpcsec.detector.runtime.pipeline import SourceBatch, capture, enrich, rule_literals
from hpcsec.detector.runtime.sensorset import SensorSet
from hpcsec.detector.runtime.sources import snapshot_samples
from hpcsec.sensors.base import SensorContext, SensorRun, SensorSpec
from hpcsec.sensors.cmdline_condense import Literals
from hpcsec.sensors.snapshot import open_snapshot, record_snapshot


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("collect", help="run sensors and print their events")
    p.add_argument(
        "--sensor",
        action="append",
        metavar="NAME",
        help="sensor to run (repeatable; default: every default-enabled sensor)",
    )
    p.add_argument("--list", action="store_true", help="list the sensors and exit")
    add_roots(p)
    p.add_argument("--host-name", metavar="NAME", help="host.name of the events")
    p.add_argument("--config", metavar="FILE", help="site config (YAML)")
    p.add_argument("--format", choices=("jsonl", "table"), default="jsonl")
    p.add_argument(
        "--rules",
        action="append",
        metavar="PATH",
        help="rule file or directory whose command-line texts a long command line keeps first "
        "(repeatable; default: the bundled rules and the config's)",
    )
    _add_sensor_options(p)
    _add_snapshot_options(p)
    p.add_argument(
        "--raw",
        action="store_true",
        help="events as the sensors produced them, without the Slurm job and site-policy fields",
    )
    p.set_defaults(func=run)


def _add_sensor_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--pcap", metavar="FILE", help="roce sensor: read RoCE v2 packets from FILE")
    p.add_argument("--interface", metavar="IFACE", help="roce sensor: sniff IFACE")
    p.add_argument(
        "--flow-interval",
        type=float,
        default=None,
        metavar="S",
        help="roce sensor: seconds of packet time per flow record (default 10)",
    )
    p.add_argument(
        "--watch", action="append", metavar="PATH", help="file sensor: watch PATH (repeatable)"
    )
    p.add_argument(
        "--duration",
        type=float,
        default=None,
        metavar="S",
        help="seconds to watch or sniff (streaming sensors)",
    )
    p.add_argument(
        "--slurm-state-dir",
        metavar="DIR",
        help="slurm_jobs sensor: --state-dir of `hpcsec slurm prolog|epilog`",
    )


def _add_snapshot_options(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--snapshot",
        metavar="DIR",
        help="write a node snapshot (the raw inputs of every sensor) into DIR",
    )
    p.add_argument(
        "--samples",
        type=int,
        default=1,
        metavar="N",
        help="--snapshot: number of samples (default 1)",
    )
    p.add_argument(
        "--interval",
        type=float,
        default=10.0,
        metavar="S",
        help="--snapshot: seconds between samples (default 10)",
    )
    p.add_argument(
        "--from-snapshot",
        metavar="DIR",
        help="replay a node snapshot instead of reading the live system",
    )


def sensor_options(args: argparse.Namespace) -> dict[str, Any]:
    return {
        k: v
        for k, v in (
            ("pcap", args.pcap),
            ("interface", args.interface),
            ("watch", args.watch),
            ("duration", args.duration),
            ("flow_interval", args.flow_interval),
            ("slurm_state_dir", args.slurm_state_dir),
        )
        if v is not None
    }


def check_arguments(args: argparse.Namespace) -> None:
    """Arguments that cannot work are usage errors (exit 2), not a sensor's error status."""
    if not args.from_snapshot:
        for flag, path in (
            ("--sysfs-root", args.sysfs_root),
            ("--procfs-root", args.procfs_root),
            ("--etc-root", args.etc_root),
        ):
            if not os.path.isdir(path):
                raise UsageError(f"{flag} {path}: no such directory")
    if args.pcap and args.interface:
        raise UsageError("--pcap and --interface exclude each other")
    if args.pcap and not os.path.isfile(args.pcap):
        raise UsageError(f"--pcap {args.pcap}: no such file")
    if args.interface:
        try:
            socket.if_nametoindex(args.interface)
        except OSError:
            raise UsageError(f"--interface {args.interface}: no such network interface") from None
    if args.flow_interval is not None and not args.flow_interval > 0:
        raise UsageError(
            f"--flow-interval must be a positive number of seconds, got {args.flow_interval:g}"
        )
    for flag, value in (("--duration", args.duration), ("--interval", args.interval)):
        if value is not None and not value >= 0:
            raise UsageError(f"{flag} must be zero or more seconds, got {value:g}")
    if args.samples < 1:
        raise UsageError(f"--samples must be at least 1, got {args.samples}")


def print_status(run: SensorRun) -> None:
    status = run.status
    print(
        f"hpcsec: sensor {run.name}: {visible(status['event.action'])}: "
        f"{visible(status.get('message', ''))}",
        file=sys.stderr,
    )


def write_events(events: list[Event], fmt: str) -> None:
    if fmt == "jsonl":
        out = sys.stdout.buffer
        for event in events:
            out.write(visible_json(dumps(event)) + b"\n")
        out.flush()
        return
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    def cell(value: object) -> Text:  # node data: never markup, controls escaped
        return Text(visible(value))

    table = Table()
    for column in ("time", "category", "action", "sensor"):
        table.add_column(column, no_wrap=True)
    table.add_column("fields", overflow="fold")
    for e in events:
        keys = [k for k in e if k.split(".")[0] not in ("event", "host", "hpcsec", "@timestamp")]
        summary = " ".join(f"{k}={e[k]}" for k in keys[:8])
        table.add_row(
            cell(str(e["@timestamp"])[11:19]),
            cell(e["event.category"]),
            cell(e["event.action"]),
            cell(e["hpcsec.sensor"]),
            cell(summary),
        )
    # piped output gets a wide table rather than rich's 80 columns
    Console(width=None if sys.stdout.isatty() else 200).print(table)


def run(args: argparse.Namespace) -> int:
    if args.list:
        for spec in registry.SENSORS:
            flag = "default" if spec.default_enabled else "opt-in"
            print(f"{spec.name:14} {flag:8} {spec.description}")
        return 0
    try:
        specs = registry.select(args.sensor)
    except KeyError as exc:
        known = ", ".join(registry.by_name())
        raise UsageError(f"unknown sensor {exc.args[0]} (known: {known})") from None
    check_arguments(args)
    config = load_config(args.config)
    if args.snapshot and args.from_snapshot:
        raise UsageError("--snapshot and --from-snapshot exclude each other")
    if args.rules and args.from_snapshot:
        raise UsageError("--rules goes with a live collect (a snapshot holds what it kept)")
    enricher = None if args.raw else Enricher(config)
    if args.from_snapshot:
        snapshot = open_snapshot(args.from_snapshot)
        with SensorSet(specs) as sensors:
            for ctx, runs in snapshot_samples(
                snapshot, config, sensors, sensor_options(args), on_skip=print_skipped
            ):
                print_runs(runs, args.format, enricher, ctx)
        return 0
    ctx = live_context(
        config,
        args.sysfs_root,
        args.procfs_root,
        args.etc_root,
        args.host_name,
        options=sensor_options(args),
        cmdline_literals=_literals(config, args.rules, specs),
    )
    if args.snapshot:
        for result in record_snapshot(args.snapshot, ctx, specs, args.samples, args.interval):
            print_status(result)
        return 0
    with SensorSet(specs) as sensors:
        print_runs(sensors.sample(ctx), args.format, enricher, ctx)
    return 0


def _literals(
    config: SiteConfig, rules: list[str] | None, specs: list[SensorSpec]
) -> Literals | None:
    """The rules' command-line literals, kept first from a long command line, so that what
    collect prints or records holds what a later scan's rules look for. Rules given with
    `--rules` must load (an error, exit 2, as for scan), whatever the sensors: the operator
    learns of a broken file. The config's are loaded only when a sensor reads command lines
    (the others' events hold none, and loading costs 0.2 s); those that cannot are said, and
    collect goes on without (flags and URLs are kept first then)."""
    if rules:
        return rule_literals(config, rules)
    if not any(spec.command_lines for spec in specs):
        return None
    try:
        return rule_literals(config, None)
    except HpcsecError as exc:
        print(
            f"hpcsec: rules not loaded, long command lines keep flags and URLs first: "
            f"{visible(str(exc))}",
            file=sys.stderr,
        )
        return None


def print_skipped(problem: str) -> None:
    print(f"hpcsec: skipped a snapshot sample: {visible(problem)}", file=sys.stderr)


def print_runs(
    runs: list[SensorRun], fmt: str, enricher: Enricher | None, ctx: SensorContext
) -> None:
    """Each sensor's status line on stderr; its events (enriched unless --raw), then the
    status records, on stdout."""
    for result in runs:
        print_status(result)
    events = [e for result in runs for e in result.events]
    if enricher is not None:  # --raw: the events as the sensors gave them, nothing captured
        view, status = capture(ctx, events)
        events = [*enrich(enricher, SourceBatch(events, view)), *status]
    events.extend(result.status for result in runs)
    write_events(events, fmt)

"""`hpcsec scan`: sensors once (or a snapshot, or an events file), rules, alerts out."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import gc
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor

from hpcsec.detector.alerts.incidents import summarize_incidents
from hpcsec.detector.alerts.model import Alert, level_rank
from hpcsec.detector.cli.common import add_config_and_rules, add_outputs, add_roots
from hpcsec.detector.cli.incident_view import write_incidents_json, write_incidents_table
from hpcsec.detector.cli.render import footer, write_json, write_jsonl, write_table
from hpcsec.detector.config.site import load_config
from hpcsec.detector.core.errors import UsageError
from hpcsec.detector.core.schema import LEVELS
from hpcsec.detector.engine import flush_parts
from hpcsec.detector.engine.config_names import config_name_errors
from hpcsec.detector.engine.evaluate import Engine
from hpcsec.detector.runtime.chunk_detect import Detect, start_workers
from hpcsec.detector.runtime.chunked import tune_gc
from hpcsec.detector.runtime.delivery import deliver_alerts, report_held, store_decision
from hpcsec.detector.runtime.endpoints import OutputSet, open_alert_outputs, open_store
from hpcsec.detector.runtime.pipeline import Pipeline, SourceBatch
from hpcsec.detector.runtime.registry import SENSORS
from hpcsec.detector.runtime.sources import EventSources, ScanReport, demo_snapshot_dir
from hpcsec.sensors.cmdline_condense import Literals

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
        "--incidents",
        action="store_true",
        help="print one row per incident (alerts that belong together) instead of the alerts",
    )
    p.add_argument(
        "--fail-on",
        choices=LEVELS,
        default=LEVELS[0],
        metavar="LEVEL",
        help="exit 1 when an alert at or above LEVEL is raised "
        f"({', '.join(LEVELS)}; default {LEVELS[0]})",
    )
    p.add_argument(
        "--min-level",
        choices=LEVELS,
        default=LEVELS[0],
        metavar="LEVEL",
        help="show and send only alerts at or above LEVEL; the others are stored only "
        f"(with --store; default {LEVELS[0]})",
    )
    p.add_argument(
        "--require-sensor",
        action="append",
        default=[],
        metavar="NAME",
        help="fail (exit 2) when this sensor is unavailable or failing (repeatable)",
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
    p.add_argument(
        "--jobs",
        type=int,
        default=None,
        metavar="N",
        help="--events: processes for a large file (all parse chunks and run the detection "
        "rules; default 2 when the machine has more than one CPU, 1 to stay on one core)",
    )
    add_roots(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    config_path = args.config
    if args.demo and not config_path:  # the demo node's own policy (assets, baselines, admins)
        config_path = str(demo_snapshot_dir() / "site-config.yml")
    # the workers start now, so their start overlaps the load of the rules
    workers = start_workers(args.events, jobs_of(args)) if args.events else None
    try:
        return _run(args, config_path, workers)
    finally:
        if workers is not None:
            workers.shutdown(cancel_futures=True)


def _run(
    args: argparse.Namespace, config_path: str | None, workers: ProcessPoolExecutor | None
) -> int:
    config = load_config(config_path)
    pipeline = Pipeline.load(
        config, args.rules, default_rules=not args.no_default_rules, dedup=not args.no_dedup
    )
    errors = config_name_errors(config, pipeline.ruleset.rules)
    if errors:  # a misspelled list or threshold would leave the rule at its default, silently
        raise errors[0]
    outputs = open_alert_outputs(
        args.output or [],
        secret_file=args.webhook_secret_file,
        spool_dir=args.spool,
        config=config,
    )
    try:
        return scan(args, pipeline, outputs, workers)
    finally:
        if outputs is not None:
            outputs.close()


def sources_of(
    args: argparse.Namespace,
    sources: EventSources,
    detect: Detect | None = None,
    cmdline_literals: Callable[[], Literals] | None = None,
) -> Iterator[SourceBatch]:
    """The scan's events; `cmdline_literals` gives the rules' (only a live scan reads
    command lines, so only it makes them)."""
    if (args.pcap or args.interface) and (args.events or args.snapshot or args.demo):
        raise UsageError("--pcap and --interface go with a live scan, not --events/--snapshot")
    if args.pcap and not os.path.isfile(args.pcap):
        raise UsageError(f"--pcap {args.pcap}: no such file")
    if args.events:
        return sources.from_events_file(args.events, BATCH, jobs_of(args), detect)
    if args.snapshot or args.demo:
        return sources.from_snapshot(args.snapshot, demo=args.demo)
    return sources.live(args, cmdline_literals() if cmdline_literals is not None else None)


def sensor_states(report: ScanReport) -> tuple[list[str], list[str]]:
    """(unavailable, failing): sensors whose status was `unavailable` / anything but `ok`
    in any sample, each named once. A sensor that ran but says among its events that what
    it reads is unavailable (slurm_jobs: Slurm unreachable) is unavailable too, as its
    line on stderr says."""
    unavailable: dict[str, None] = {}
    failing: dict[str, None] = {}
    for run in report.sensor_runs:
        action = run.status.get("event.action")
        if action == "ok" and any(
            e.get("event.category") == "sensor_status" and e.get("event.action") == "unavailable"
            for e in run.events
        ):
            action = "unavailable"
        if action == "unavailable":
            unavailable[run.name] = None
        elif action != "ok":
            failing[run.name] = None
    return list(unavailable), list(failing)


def check_required(required: Sequence[str], report: ScanReport) -> None:
    """UsageError (exit 2) when a sensor the user requires did not run cleanly: a scan
    that was blind where it matters must not pass for a clean one."""
    if not required:
        return
    known = {spec.name for spec in SENSORS}
    unknown = [name for name in required if name not in known]
    if unknown:
        raise UsageError(
            f"--require-sensor {', '.join(map(repr, unknown))}: no such sensor "
            f"(known: {', '.join(sorted(known))})"
        )
    ran = {run.name for run in report.sensor_runs}
    unavailable, failing = sensor_states(report)
    problems = []
    for name in dict.fromkeys(required):
        if name not in ran:
            problems.append(f"{name} did not run")
        elif name in unavailable:
            problems.append(f"{name} is unavailable")
        elif name in failing:
            problems.append(f"{name} is failing")
    if problems:
        raise UsageError("required sensor " + "; ".join(problems) + " (see the lines above)")


def split_by_level(alerts: list[Alert], min_level: str) -> tuple[list[Alert], list[Alert]]:
    """(at or above min_level, below it)."""
    floor = level_rank(min_level)
    shown = [a for a in alerts if level_rank(a.get("rule.level")) >= floor]
    return shown, [a for a in alerts if level_rank(a.get("rule.level")) < floor]


def jobs_of(args: argparse.Namespace) -> int:
    if args.jobs is None:  # a second process about halves the wait
        return 2 if (os.cpu_count() or 1) > 1 else 1
    if args.jobs < 1:
        raise UsageError(f"--jobs {args.jobs}: needs at least 1")
    return int(args.jobs)


def scan(
    args: argparse.Namespace,
    pipeline: Pipeline,
    outputs: OutputSet | None,
    workers: ProcessPoolExecutor | None = None,
) -> int:
    with scan_gc():
        return _scan(args, pipeline, outputs, workers)


@contextlib.contextmanager
def scan_gc() -> Iterator[None]:
    """The rules and compiled code, alive as long as the scan, out of every GC pass, and
    young objects collected less often (see tune_gc); as before once the scan is over."""
    thresholds = gc.get_threshold()
    gc.freeze()
    tune_gc()
    try:
        yield
    finally:
        gc.set_threshold(*thresholds)
        gc.unfreeze()


def _scan(
    args: argparse.Namespace,
    pipeline: Pipeline,
    outputs: OutputSet | None,
    workers: ProcessPoolExecutor | None,
) -> int:
    config = pipeline.config
    report = ScanReport()
    store_path = args.store or config.store_path
    # the store keeps every event: then the workers only parse, and this process evaluates
    parallel = args.events and not store_path and jobs_of(args) > 1
    detect = Detect.of(pipeline.ruleset, pipeline.engine) if parallel else None
    batches = sources_of(
        args,
        EventSources(config, report, workers),
        detect,
        lambda: pipeline.cmdline_literals,
    )
    store = open_store(store_path, config.retention_days)
    if workers is not None:  # they may take a share of the correlation pass at the end
        flush_parts.keep_fields(pipeline.engine)
    for batch in batches:
        step = pipeline.process([batch])
        if store is not None:
            store.insert_events(step.events)
        del batch, step  # not alive while the next batch is read: one batch at a time
    pipeline.flush(workers, jobs_of(args) - 1)  # the workers, idle now, take a share
    report.print(sys.stderr)
    for warning in correlation_warnings(pipeline.engine):
        print(f"hpcsec: warning: {warning}", file=sys.stderr)
    decision = pipeline.stage.conclude()
    report_held(decision)
    alerts, below = split_by_level(decision.send, args.min_level)
    decision = dataclasses.replace(decision, send=alerts)
    delivery = None
    if outputs is not None:
        delivery = deliver_alerts(outputs, alerts)
    else:
        write_alerts(alerts, args.format, incidents=args.incidents)
    unavailable, failing = sensor_states(report)
    line = footer(alerts, unavailable, failing, hidden=len(below))
    # under the table on stdout; beside JSON (which must stay parseable) on stderr
    print(line, file=sys.stdout if outputs is None and args.format == "table" else sys.stderr)
    if store is not None:
        store_decision(store, decision, delivery)
        store.insert_alerts(below, "below_min_level", f"below --min-level {args.min_level}")
    check_required(args.require_sensor, report)
    threshold = level_rank(args.fail_on)
    return 1 if any(level_rank(a["rule.level"]) >= threshold for a in alerts) else 0


def correlation_warnings(engine: Engine) -> list[str]:
    """What the correlations could not see of the input, said rather than silently missed:
    a scan is exact only for matches it could put in event-time order with a time, within
    the groups it may keep open."""
    stats, pending = engine.stats, engine.pending
    warnings = []
    if stats.late_events:
        warnings.append(
            f"{stats.late_events} rule match(es) not correlated: the events are further out "
            f"of event-time order than a scan holds to sort them ({pending.max_pending:,} "
            f"matches, {pending.max_bytes / 2**20:,.0f} MiB of their events) (sort the events "
            "by @timestamp to correlate them all)"
        )
    if stats.untimed_events:
        warnings.append(
            f"{stats.untimed_events} rule match(es) not correlated: their event has no @timestamp"
        )
    if stats.evicted_groups:
        warnings.append(
            f"{stats.evicted_groups} correlation group(s) dropped before their window ended: "
            f"more than {engine.max_groups:,} of one correlation were open at once"
        )
    return warnings


def write_alerts(alerts: list[Alert], fmt: str, incidents: bool = False) -> None:
    if incidents:
        rows = summarize_incidents(alerts)
        if fmt == "table":
            write_incidents_table(rows, title=f"hpcsec: {len(rows)} incident(s)")
        elif fmt == "jsonl":  # one incident per line, as --format jsonl gives alerts
            write_jsonl([row.as_dict() for row in rows])
        else:
            write_incidents_json(rows)
    elif fmt == "json":
        write_json(alerts)
    elif fmt == "jsonl":
        write_jsonl(alerts)
    else:
        write_table(alerts, title=f"hpcsec: {len(alerts)} alert(s)")

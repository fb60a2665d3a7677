"""`hpcsec firmware baseline`: golden firmware versions of a node class, from a node.

Run on a node that is known good (or on a snapshot of one), it writes a site config that holds
just this baseline, `{node_class: <class>, firmware: {baselines: {<class>: {component:
version}}}}`: usable as it stands with `--config FILE`, or merged into the site's config by
copying the class's entry under `firmware.baselines` (with `vulnerable:` next to it). One
version per component, as the config holds: where devices of one component disagree (a GPU
with another VBIOS), the most common version is kept and the others are named on stderr,
since a golden node with mixed firmware is itself worth a look.
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import yaml

from hpcsec.detector.config.site import load_config
from hpcsec.detector.core.display import visible
from hpcsec.detector.core.errors import HpcsecError, UsageError
from hpcsec.detector.core.fields import FIRMWARE_COMPONENTS
from hpcsec.detector.core.schema import Event
from hpcsec.detector.core.timefmt import rfc3339
from hpcsec.detector.runtime.node import live_context
from hpcsec.sensors.base import SensorContext, SensorSpec, run_sensor
from hpcsec.sensors.firmware import FirmwareSensor
from hpcsec.sensors.snapshot import open_snapshot


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("firmware", help="firmware baselines (golden versions per node class)")
    actions = p.add_subparsers(dest="firmware_command", metavar="ACTION", required=True)
    b = actions.add_parser(
        "baseline",
        help="write the firmware versions of this node (or of a snapshot) as the "
        "baseline of a node class, in the site config's `firmware:` shape",
    )
    b.add_argument(
        "--node-class",
        metavar="NAME",
        help="node class the baseline is for (default: node_class of --config)",
    )
    b.add_argument("--config", metavar="FILE", help="site config (YAML), for node_class")
    b.add_argument(
        "--sysfs-root",
        default="/sys",
        metavar="DIR",
        help="directory that holds class/… (default /sys)",
    )
    b.add_argument(
        "--from-snapshot",
        metavar="DIR",
        help="read the last sample of a node snapshot instead of this node",
    )
    b.add_argument("-o", "--output", metavar="FILE", help="write to FILE (default: stdout)")
    b.set_defaults(func=run_baseline)


def _context(args: argparse.Namespace) -> SensorContext:
    if args.from_snapshot:
        snapshot = open_snapshot(args.from_snapshot)
        if not snapshot.samples:
            raise UsageError(f"snapshot {args.from_snapshot} has no samples")
        return snapshot.samples[-1].context(None, {})
    if not Path(args.sysfs_root).is_dir():
        raise UsageError(f"--sysfs-root {args.sysfs_root}: no such directory")
    return live_context(load_config(None), sysfs_root=args.sysfs_root)


def collect_inventory(ctx: SensorContext) -> list[Event]:
    """The firmware events of one sample; notes go to stderr; HpcsecError when none."""
    spec = SensorSpec("firmware", FirmwareSensor, "firmware inventory")
    result = run_sensor(spec, FirmwareSensor(), ctx)
    if not result.ok:
        raise HpcsecError(
            f"firmware inventory {result.status['event.action']}: "
            f"{result.status.get('message', '')}"
        )
    for event in result.events:
        if event["event.category"] == "sensor_status":
            message = visible(event.get("message"))  # firmware strings come from the node
            print(f"hpcsec firmware baseline: note: {message}", file=sys.stderr)
    return [e for e in result.events if e["event.category"] == "firmware"]


def golden_versions(events: list[Event]) -> tuple[dict[str, str], list[str]]:
    """component -> the most common version, and a warning per disagreeing component."""
    seen: dict[str, Counter[str]] = {}
    devices: dict[tuple[str, str], list[str]] = {}
    for e in events:
        component, version = e["firmware.component"], e["firmware.version"]
        seen.setdefault(component, Counter())[version] += 1
        devices.setdefault((component, version), []).append(e["firmware.device"])
    golden, warnings = {}, []
    for component in FIRMWARE_COMPONENTS:
        counts = seen.get(component)
        if not counts:
            continue
        # most devices first; among equals the lowest version string, so reruns agree
        ranked = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
        golden[component] = ranked[0][0]
        if len(ranked) > 1:
            others = ", ".join(
                f"{v} on {', '.join(devices[(component, v)])}" for v, _ in ranked[1:]
            )
            warnings.append(
                f"{component}: devices disagree; keeping {ranked[0][0]} "
                f"({ranked[0][1]} devices), also found {others}"
            )
    return golden, warnings


def baseline_yaml(node_class: str, golden: dict[str, str], source: str) -> str:
    """A site config of its own (usable as --config FILE), holding the one baseline."""
    header = (
        f"# hpcsec firmware baseline for node class {node_class!r}\n"
        f"# from {source} at {rfc3339()}\n"
        f"# A site config as it stands (--config FILE); to merge it into another, copy\n"
        f"# the {node_class} entry under that file's firmware.baselines.\n"
    )
    body: dict[str, Any] = {
        "node_class": node_class,
        "firmware": {"baselines": {node_class: golden}},
    }
    return header + yaml.safe_dump(body, sort_keys=False, default_flow_style=False)


def run_baseline(args: argparse.Namespace) -> int:
    node_class = args.node_class or load_config(args.config).node_class
    if not node_class:
        raise UsageError("name the node class: --node-class NAME (or node_class in --config)")
    ctx = _context(args)
    golden, warnings = golden_versions(collect_inventory(ctx))
    for warning in warnings:
        print(f"hpcsec firmware baseline: warning: {visible(warning)}", file=sys.stderr)
    source = f"snapshot {args.from_snapshot}" if args.from_snapshot else f"host {ctx.host_name}"
    text = baseline_yaml(node_class, golden, source)
    if args.output:
        try:
            Path(args.output).write_text(text)
        except OSError as exc:
            raise UsageError(f"cannot write {args.output}: {exc.strerror}") from None
    else:
        sys.stdout.write(text)
    return 0

"""`hpcsec report`: a self-contained HTML report of a scan (demo, snapshot, events) or of the
alert store."""

from __future__ import annotations

import argparse
import os
import sys

from hpcsec.detector.cli.common import add_config_and_rules
from hpcsec.detector.core.errors import UsageError
from hpcsec.detector.core.schema import rfc3339


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "report",
        help="write a self-contained HTML report: incidents, timelines, counts and plots",
        description="Scan a source (or read the alert store) and write one HTML file with no "
        "external asset and no script.",
    )
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--demo", action="store_true", help="the bundled demo snapshot")
    src.add_argument("--snapshot", metavar="DIR", help="replay a node snapshot")
    src.add_argument("--events", metavar="FILE|-", help="JSONL events")
    src.add_argument("--store", metavar="FILE", help="the alerts of a DuckDB alert store")
    add_config_and_rules(p)
    p.add_argument("-o", "--output", required=True, metavar="FILE.html", help="where to write")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    # imported here, where a report is made: gathering pulls in the engine (pySigma) and the
    # store (DuckDB), which `hpcsec report --help` must not pay for
    from hpcsec.detector.report.gather import scan_alerts, store_alerts
    from hpcsec.detector.report.page import render

    if args.store and args.rules:
        raise UsageError("--rules goes with a scan (--demo, --snapshot, --events), not --store")
    if args.store:
        data = store_alerts(args.store)
    else:
        data = scan_alerts(
            config_path=args.config,
            rules=args.rules,
            snapshot=args.snapshot,
            events_file=args.events,
            demo=args.demo,
        )
    page = render(data, generated=rfc3339())
    try:
        # private like a snapshot: the page quotes command lines and paths of the node's users
        fd = os.open(args.output, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            out.write(page)
    except OSError as exc:
        raise UsageError(f"cannot write {args.output}: {exc.strerror}") from None
    print(
        f"hpcsec: report of {len(data.alerts)} alert(s) written to {args.output}", file=sys.stderr
    )
    return 0

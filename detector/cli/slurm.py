"""`hpcsec slurm prolog|epilog`: the command line of Slurm's Prolog= and Epilog= hooks.

The hooks themselves are detector/slurm/hooks.py; this module parses their arguments and
always exits 0 (a failing prolog or epilog drains the node).
"""

from __future__ import annotations

import argparse
import os
import sys

from hpcsec.detector.core import log
from hpcsec.detector.slurm.hooks import HookSettings, run_hook
from hpcsec.detector.slurm.hookstate import (
    DEFAULT_HOOK_STATE_DIR,
    HOOK_EVENTS_FILE,
    default_hook_state_dir,
)

DEFAULT_STATE_DIR = DEFAULT_HOOK_STATE_DIR
EVENTS_FILE = HOOK_EVENTS_FILE


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("slurm", help="Slurm Prolog=/Epilog= hooks (always exit 0)")
    hooks = p.add_subparsers(dest="hook", metavar="HOOK", required=True)
    for name, text in (
        ("prolog", "record a job start (run by slurmd as Prolog=)"),
        ("epilog", "record a job end and what it left behind (Epilog=)"),
    ):
        h = hooks.add_parser(name, help=text)
        h.add_argument(
            "--state-dir",
            default=default_hook_state_dir(),
            metavar="DIR",
            help=f"job state and {EVENTS_FILE} (default $HPCSEC_STATE_DIR or {DEFAULT_STATE_DIR})",
        )
        h.add_argument("--procfs-root", default="/proc", metavar="DIR")
        h.add_argument("--etc-root", default="/etc", metavar="DIR")
        h.add_argument("--host-name", metavar="NAME", help="host.name of the events")
        h.add_argument(
            "--nvml-json",
            metavar="FILE",
            help="read GPU state from an nvml.json dump instead of NVML",
        )
        h.add_argument(
            "--slurm-timeout",
            type=float,
            default=2.0,
            metavar="S",
            help="timeout of each Slurm command (default 2)",
        )
        h.set_defaults(func=run)


def main(argv: list[str] | None = None) -> int:
    """`python -m hpcsec.detector.cli.slurm prolog|epilog …`: the same hooks without the
    rest of the command line (Sigma, DuckDB) to import, for slurmd's time budget."""
    parser = argparse.ArgumentParser(prog="hpcsec-slurm-hook")
    register(parser.add_subparsers(dest="command", required=True))
    log.setup()  # as `hpcsec slurm` has it: under slurmd, records go to the journal
    try:
        args = parser.parse_args(["slurm", *(sys.argv[1:] if argv is None else argv)])
    except SystemExit:
        return 0  # a bad Prolog= line must not drain the node; argparse printed why
    return run(args)


def run(args: argparse.Namespace) -> int:
    settings = HookSettings(
        args.hook,
        args.state_dir,
        args.procfs_root,
        args.etc_root,
        args.host_name,
        args.nvml_json,
        args.slurm_timeout,
    )
    run_hook(settings, dict(os.environ))
    return 0  # always: a failing prolog or epilog drains the node


if __name__ == "__main__":
    sys.exit(main())

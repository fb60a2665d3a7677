"""`hpcsec` command line: one module per sub-command under detector/cli/."""

from __future__ import annotations

import argparse
import importlib
import sys

from hpcsec.detector.core.errors import HpcsecError

# Explicit order of sub-commands (module name under detector/cli/).
COMMANDS = ("scan", "collect", "rules", "config", "alerts", "agent", "slurm", "firmware")

EXIT_OK, EXIT_ALERTS, EXIT_USAGE = 0, 1, 2


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The parser; with `only`, just that sub-command's module is imported.

    Importing every command pulls in pySigma, DuckDB and scapy; `hpcsec slurm prolog` runs
    before every job and must not pay for them.
    """
    parser = argparse.ArgumentParser(
        prog="hpcsec",
        description="Security detection for GPU/HPC clusters: node sensors, Sigma rules, "
        "Slurm job context.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in (only,) if only in COMMANDS else COMMANDS:
        importlib.import_module(f"{__package__}.{name}").register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = build_parser(argv[0] if argv else None)
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except HpcsecError as exc:
        print(f"hpcsec: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # `hpcsec ... | head`
        return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())

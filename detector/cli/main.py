"""`hpcsec` command line: one module per sub-command under detector/cli/.

Exit codes: 0 ok (no alerts), 1 alerts found (scan), 2 an error the user can fix (bad
arguments, config, rules, input), 3 an internal error (a bug: its traceback is logged),
130 interrupted.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
import traceback

from hpcsec.detector.core import log
from hpcsec.detector.core.display import visible
from hpcsec.detector.core.errors import HpcsecError

# Explicit order of sub-commands (module name under detector/cli/).
COMMANDS = (
    "scan",
    "collect",
    "rules",
    "config",
    "alerts",
    "agent",
    "slurm",
    "firmware",
    "publish",
    "hub",
)

EXIT_OK, EXIT_USAGE, EXIT_INTERNAL, EXIT_INTERRUPTED = 0, 2, 3, 130


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
    parser.add_argument(
        "--debug",
        action="store_true",
        help="debug messages, and the traceback of an internal error, on stderr",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in (only,) if only in COMMANDS else COMMANDS:
        importlib.import_module(f"{__package__}.{name}").register(sub)
    return parser


def _leading_options(argv: list[str]) -> list[str]:
    """The global options: those before the sub-command's name."""
    out = []
    for arg in argv:
        if not arg.startswith("-"):
            break
        out.append(arg)
    return out


def _one_line(text: str) -> str:
    return visible(" ".join(text.split()))


def report_internal_error(exc: BaseException, debug: bool) -> int:
    """One line on stderr for a bug; the traceback where it helps without flooding."""
    what = _one_line(f"{type(exc).__name__}: {exc}")
    if debug:
        traceback.print_exception(exc, file=sys.stderr)
        where = "above"
    elif log.under_systemd(os.environ):
        logging.getLogger(log.LOGGER_NAME).error("traceback", exc_info=exc)
        where = "in the journal"
    else:
        try:
            path = log.log_path()
        except RuntimeError:  # no home directory to keep the log in
            path = None
        if path is not None and log.write_traceback(exc, path):
            where = f"in {_one_line(str(path))}"
        else:  # no private file to write: the traceback is still better on screen than lost
            traceback.print_exception(exc, file=sys.stderr)
            where = "above"
    print(f"hpcsec: internal error: {what} (traceback {where})", file=sys.stderr)
    return EXIT_INTERNAL


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    leading = _leading_options(argv)
    debug = "--debug" in leading
    command = argv[len(leading)] if len(argv) > len(leading) else None
    log.setup(debug=debug, service=command in log.SERVICE_COMMANDS)
    try:
        args = build_parser(command).parse_args(argv)
        return int(args.func(args) or 0)
    except HpcsecError as exc:
        print(f"hpcsec: error: {visible(exc)}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except BrokenPipeError:  # `hpcsec ... | head`
        return EXIT_OK
    except Exception as exc:
        return report_internal_error(exc, debug)


if __name__ == "__main__":
    sys.exit(main())

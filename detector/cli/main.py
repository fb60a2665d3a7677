"""`hpcsec` command line: one module per sub-command under detector/cli/.

Exit codes: 0 ok (no alerts), 1 alerts found (scan), 2 an error the user can fix (bad
arguments, config, rules, input), 3 an internal error (a bug: its traceback is logged),
130 interrupted.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

from hpcsec.detector.core import log
from hpcsec.detector.core.display import visible
from hpcsec.detector.core.errors import HpcsecError

# typing.TYPE_CHECKING without importing typing, which `hpcsec --help` would import for this
# alone (mypy reads any name TYPE_CHECKING so)
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

# Sub-commands in the order `--help` lists them (module name under detector/cli/) and their
# one-line help. The lines are kept here, not read from the modules, so that `hpcsec --help`
# imports no command module at all; a test checks they match what each module registers.
COMMANDS = {
    "scan": "run sensors once (or read a snapshot/events), evaluate the rules, print or send "
    "alerts",
    "collect": "run sensors and print their events",
    "rules": "list, check, test and convert Sigma rules",
    "config": "validate or show a site config",
    "alerts": "query the alert store (or export its events to Parquet)",
    "report": "write a self-contained HTML report: incidents, timelines, counts and plots",
    "agent": "run continuously on a node: sampled sensors, the file access stream, rules, "
    "alerts to outputs and the store; SIGHUP reloads",
    "slurm": "Slurm Prolog=/Epilog= hooks (always exit 0)",
    "firmware": "firmware baselines (golden versions per node class)",
    "publish": "publish a node's events (events file or snapshot) to NATS JetStream for the hubs",
    "hub": "consume the events of all nodes from NATS JetStream and evaluate the rules "
    "across nodes (correlations span the fleet)",
}

EXIT_OK, EXIT_USAGE, EXIT_INTERNAL, EXIT_INTERRUPTED = 0, 2, 3, 130


def package_version() -> str:
    from importlib.metadata import PackageNotFoundError, version  # only for --version

    try:
        return version("hpcsec")
    except PackageNotFoundError:  # run from a source tree that was never installed
        return "unknown (not installed)"


class _VersionAction(argparse.Action):
    """`hpcsec --version`: looks the version up only when asked (start-up time)."""

    def __call__(self, parser: argparse.ArgumentParser, *_args: object, **_kw: object) -> None:
        print(f"hpcsec {package_version()}")
        parser.exit()


class _Formatter(argparse.HelpFormatter):
    """argparse's help formatter, sized without `import shutil` (with bz2 and lzma under it):
    argparse builds one of these for every argument it adds, so every command would pay for
    that import. The width is what shutil.get_terminal_size gives, read once per process."""

    _columns: int | None = None

    def __init__(
        self,
        prog: str,
        indent_increment: int = 2,
        max_help_position: int = 24,
        width: int | None = None,
    ) -> None:
        if width is None:
            width = _Formatter.columns() - 2
        super().__init__(prog, indent_increment, max_help_position, width)

    @classmethod
    def columns(cls) -> int:
        if cls._columns is None:
            cls._columns = _terminal_columns()
        return cls._columns


def _terminal_columns() -> int:
    """COLUMNS when it is a positive number, else the width of the terminal on stdout, else 80
    (shutil.get_terminal_size's order)."""
    try:
        columns = int(os.environ["COLUMNS"])
    except (KeyError, ValueError):
        columns = 0
    if columns <= 0:
        try:
            columns = os.get_terminal_size(sys.__stdout__.fileno()).columns  # type: ignore[union-attr]
        except (AttributeError, ValueError, OSError):
            columns = 0
    return columns or 80


class _Parser(argparse.ArgumentParser):
    """The parser of `hpcsec` and, through add_subparsers, of every sub-command."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", _Formatter)
        super().__init__(*args, **kwargs)


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The parser; with `only` a known sub-command, just that sub-command's module is imported,
    and without one (`hpcsec --help`, a typo) none is: the sub-commands are listed from
    COMMANDS.

    Importing every command pulls in pySigma, DuckDB and scapy; `hpcsec slurm prolog` runs
    before every job and must not pay for them, nor should `hpcsec --help`.
    """
    parser = _Parser(
        prog="hpcsec",
        description="Security detection for GPU/HPC clusters: node sensors, Sigma rules, "
        "Slurm job context.",
    )
    parser.add_argument(
        "--debug",
        action="store_true",
        help="debug messages, and the traceback of an internal error, on stderr",
    )
    parser.add_argument(
        "--version", action=_VersionAction, nargs=0, help="print the version and exit"
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    if only in COMMANDS:
        importlib.import_module(f"{__package__}.{only}").register(sub)
    else:
        for name, text in COMMANDS.items():
            sub.add_parser(name, help=text)
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
    import traceback  # only for a bug: a command that runs well does not import it

    what = _one_line(f"{type(exc).__name__}: {exc}")
    if debug:
        traceback.print_exception(exc, file=sys.stderr)
        where = "above"
    elif log.under_systemd(os.environ):
        log.get_logger().error("traceback", exc_info=exc)
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
    # What we write holds the node's command lines and environments: nothing of it for group
    # or others, whatever umask we were started with (DuckDB's WAL follows the umask alone).
    # Restored on return, for a caller that runs main() in its own process (tests).
    started_with = os.umask(0o077)
    os.umask(started_with | 0o077)
    try:
        return _main(sys.argv[1:] if argv is None else argv)
    finally:
        os.umask(started_with)


def _main(argv: list[str]) -> int:
    leading = _leading_options(argv)
    debug = "--debug" in leading
    command = argv[len(leading)] if len(argv) > len(leading) else None
    log.setup(debug=debug, service=command in log.SERVICE_COMMANDS)
    if command == "slurm":
        # The Prolog=/Epilog= contract: whatever happens (bad arguments, a module that does
        # not import, a bug), exit 0 once it is reported: a failing hook drains the node.
        try:
            code = _run(argv, command, debug)
        except SystemExit as exc:  # argparse has printed why
            code = EXIT_USAGE if exc.code else EXIT_OK
        return EXIT_INTERRUPTED if code == EXIT_INTERRUPTED else EXIT_OK
    return _run(argv, command, debug)


def _run(argv: list[str], command: str | None, debug: bool) -> int:
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

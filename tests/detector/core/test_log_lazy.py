"""core/log.setup() does not import `logging`: a command that logs nothing does not pay for it.
Every hpcsec module takes its logger from log.get_logger, so the `hpcsec` logger is configured
before one of its records can be written (escaping, levels, the journal's form). Each case
runs in a fresh interpreter, the only place where `logging` is not imported already."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def run_fresh(code: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code, *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": "/usr/bin:/bin"},  # no JOURNAL_STREAM/INVOCATION_ID: not under systemd
    )


LATE_IMPORT = """
import sys
from hpcsec.detector.core import log
log.setup(debug=sys.argv[1] == "debug", service=sys.argv[1] == "service")
assert "logging" not in sys.modules
import logging
late = log.get_logger("hpcsec.late")
late.debug("a debug record")
late.info("an info record")
late.warning("x\\x1b[2Jy\\nforged")
"""


def test_a_logger_imported_after_setup_is_configured() -> None:
    done = run_fresh(LATE_IMPORT, "plain")
    assert done.returncode == 0, done.stderr
    assert done.stderr == "hpcsec: WARNING: x\\x1b[2Jy\\x0aforged\n"


def test_the_level_set_before_the_import_is_the_one_applied() -> None:
    debug = run_fresh(LATE_IMPORT, "debug").stderr.splitlines()
    assert debug[0] == "hpcsec: DEBUG: hpcsec.late: a debug record"
    assert len(debug) == 3
    service = run_fresh(LATE_IMPORT, "service").stderr.splitlines()
    assert service == ["hpcsec: INFO: an info record", "hpcsec: WARNING: x\\x1b[2Jy\\x0aforged"]


def test_the_last_setup_before_the_import_wins() -> None:
    code = LATE_IMPORT.replace(
        'assert "logging"', 'log.setup(debug=True)\nassert "logging"'
    ).replace('sys.argv[1] == "debug"', "False")
    lines = run_fresh(code, "plain").stderr.splitlines()
    assert lines[0] == "hpcsec: DEBUG: hpcsec.late: a debug record"


def test_get_logger_configures_where_logging_came_before_setup() -> None:
    code = (
        "import logging\n"
        "from hpcsec.detector.core import log\n"
        "log.setup()\n"
        "log.get_logger('hpcsec.x').error('once')\n"
    )
    assert run_fresh(code).stderr == "hpcsec: ERROR: once\n"


HOOK_BUG = """
import sys
from hpcsec.detector.cli import slurm as hook_cli
from hpcsec.detector.slurm import hooks

def bug(self):
    raise RuntimeError("boom")

hooks.Hook.prolog = bug
assert "logging" not in sys.modules
sys.exit(hook_cli.main(["prolog", "--state-dir", sys.argv[1]]))
"""


def test_a_hook_that_fails_in_a_fresh_process_logs_its_traceback(tmp_path) -> None:
    """The hooks import `logging` only to report a bug: the report is still the configured one."""
    code = HOOK_BUG.replace("import sys\n", "import os, sys\nos.environ['SLURM_JOB_ID'] = '12'\n")
    done = run_fresh(code, str(tmp_path / "state"))
    assert done.returncode == 0
    assert done.stderr.startswith("hpcsec: ERROR: slurm prolog: internal error: RuntimeError: boom")
    assert "Traceback (most recent call last)" in done.stderr
    assert done.stderr.endswith(", in bug\nRuntimeError: boom\n")


def test_a_module_imported_after_setup_logs_configured() -> None:
    code = (
        "import sys\n"
        "from hpcsec.detector.core import log\n"
        "log.setup()\n"
        "assert 'logging' not in sys.modules\n"
        "from hpcsec.detector.runtime import threads\n"
        "threads.logger.warning('x\\x1b[2Jy')\n"
    )
    assert run_fresh(code).stderr == "hpcsec: WARNING: x\\x1b[2Jy\n"


THREADS = """
import sys, threading
from hpcsec.detector.core import log
errors = []
def run(n):
    try:
        log.setup(debug=n % 2 == 0)
        log.get_logger("hpcsec.t").debug("d")
    except BaseException as exc:
        errors.append(repr(exc))
for _ in range(20):
    threads = [threading.Thread(target=run, args=(n,)) for n in range(8)]
    [t.start() for t in threads]
    [t.join() for t in threads]
import logging
assert not errors, errors
assert len(logging.getLogger("hpcsec").handlers) == 1, logging.getLogger("hpcsec").handlers
"""


def test_threads_setting_up_at_once_leave_one_handler_and_raise_nothing() -> None:
    done = run_fresh(THREADS)
    assert done.returncode == 0, done.stderr


def _named_loggers(path: Path) -> list[int]:
    """Lines of `path` that call logging.getLogger with `__name__` or an `hpcsec` name."""
    lines = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if not (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "getLogger"
            and node.args
        ):
            continue
        name = node.args[0]
        ours = isinstance(name, ast.Name) and name.id == "__name__"
        ours |= isinstance(name, ast.Constant) and str(name.value).startswith("hpcsec")
        if ours:
            lines.append(node.lineno)
    return lines


def test_every_hpcsec_logger_comes_from_get_logger(tmp_path: Path) -> None:
    """A module that took `logging.getLogger(__name__)` itself could write a record before
    setup()'s configuration is applied: raw control bytes on the terminal or in the journal."""
    allowed = {ROOT / "detector/core/log.py", ROOT / "detector/core/loghandler.py"}
    found = {
        str(path.relative_to(ROOT)): lines
        for tree in ("detector", "sensors")
        for path in sorted((ROOT / tree).rglob("*.py"))
        if path not in allowed and (lines := _named_loggers(path))
    }
    assert found == {}
    taken = tmp_path / "taken.py"  # the check finds both forms
    taken.write_text(
        "import logging\na = logging.getLogger(__name__)\nb = logging.getLogger('hpcsec.x')\n"
    )
    assert _named_loggers(taken) == [2, 3]

"""core/log.setup() does not import `logging`: a command that logs nothing does not pay for it.
Whatever imports `logging` afterwards, the `hpcsec` logger is configured before a record can be
written (escaping, levels, the journal's form). Each case runs in a fresh interpreter, the
only place where `logging` is not imported already."""

from __future__ import annotations

import subprocess
import sys


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
logging.getLogger("hpcsec.late").debug("a debug record")
logging.getLogger("hpcsec.late").info("an info record")
logging.getLogger("hpcsec.late").warning("x\\x1b[2Jy\\nforged")
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

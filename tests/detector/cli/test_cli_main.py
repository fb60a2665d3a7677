"""`hpcsec` entry point: exit codes, the one-line error reports, logging and --debug."""

import logging
import os
import stat

import pytest

from hpcsec.detector.cli import config as config_command
from hpcsec.detector.cli import main as cli
from hpcsec.detector.config.site import SiteConfig
from hpcsec.detector.core import log
from hpcsec.detector.core.errors import ConfigError


@pytest.fixture
def terminal_env(monkeypatch, tmp_path):
    """Not under systemd, with the private log under tmp_path."""
    monkeypatch.delenv("JOURNAL_STREAM", raising=False)
    monkeypatch.delenv("INVOCATION_ID", raising=False)
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    return tmp_path / "state" / "hpcsec" / "hpcsec.log"


def _crash_config_check(monkeypatch, exc):
    def load_config(path):
        raise exc

    monkeypatch.setattr(config_command, "load_config", load_config)


def test_a_user_error_is_one_line_and_exit_2(monkeypatch, terminal_env, capsys):
    _crash_config_check(monkeypatch, ConfigError("assets must be a list"))
    assert cli.main(["config", "check", "site.yml"]) == 2
    assert capsys.readouterr().err == "hpcsec: error: assets must be a list\n"
    assert not terminal_env.exists()


def test_a_bug_is_one_line_exit_3_and_its_traceback_goes_to_a_private_log(
    monkeypatch, terminal_env, capsys
):
    _crash_config_check(monkeypatch, RuntimeError("boom\n\x1b[2Jagain"))
    assert cli.main(["config", "check", "site.yml"]) == 3
    out, err = capsys.readouterr()
    assert out == ""
    assert err == (
        f"hpcsec: internal error: RuntimeError: boom \\x1b[2Jagain (traceback in {terminal_env})\n"
    )
    text = terminal_env.read_text()
    assert "Traceback (most recent call last)" in text
    assert "in load_config" in text and "RuntimeError: boom" in text
    assert stat.S_IMODE(terminal_env.stat().st_mode) == 0o600
    assert stat.S_IMODE(terminal_env.parent.stat().st_mode) == 0o700
    # a second crash appends
    assert cli.main(["config", "check", "site.yml"]) == 3
    assert terminal_env.read_text().count("Traceback") == 2


def test_the_private_log_never_follows_a_symlink(monkeypatch, terminal_env, tmp_path, capsys):
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    terminal_env.parent.mkdir(parents=True)
    terminal_env.symlink_to(victim)
    _crash_config_check(monkeypatch, RuntimeError("boom"))
    assert cli.main(["config", "check", "site.yml"]) == 3
    err = capsys.readouterr().err
    assert victim.read_text() == "precious\n"
    # nowhere safe to write: the traceback is shown rather than lost
    assert "Traceback (most recent call last)" in err
    assert err.endswith("hpcsec: internal error: RuntimeError: boom (traceback above)\n")


def test_a_symlinked_log_directory_is_refused(monkeypatch, terminal_env, tmp_path, capsys):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    terminal_env.parent.parent.mkdir(parents=True)
    terminal_env.parent.symlink_to(elsewhere)
    _crash_config_check(monkeypatch, RuntimeError("boom"))
    assert cli.main(["config", "check", "site.yml"]) == 3
    assert list(elsewhere.iterdir()) == []
    assert capsys.readouterr().err.endswith("(traceback above)\n")


def test_debug_puts_the_traceback_on_stderr(monkeypatch, terminal_env, capsys):
    _crash_config_check(monkeypatch, KeyError("missing"))
    assert cli.main(["--debug", "config", "check", "site.yml"]) == 3
    err = capsys.readouterr().err
    assert "Traceback (most recent call last)" in err
    assert err.endswith("hpcsec: internal error: KeyError: 'missing' (traceback above)\n")
    assert not terminal_env.exists()


def test_under_systemd_the_traceback_goes_to_the_journal(monkeypatch, terminal_env, capsys):
    monkeypatch.setenv("INVOCATION_ID", "0123456789abcdef")
    _crash_config_check(monkeypatch, ValueError("bad"))
    assert cli.main(["config", "check", "site.yml"]) == 3
    err = capsys.readouterr().err
    assert "hpcsec: ERROR: traceback\nTraceback (most recent call last)" in err
    assert err.endswith("hpcsec: internal error: ValueError: bad (traceback in the journal)\n")
    assert not terminal_env.exists()


def test_interrupt_exits_130(monkeypatch, terminal_env):
    _crash_config_check(monkeypatch, KeyboardInterrupt())
    assert cli.main(["config", "check", "site.yml"]) == 130


@pytest.mark.parametrize(
    ("argv_head", "env", "shown"),
    [
        ([], {}, {"WARNING", "ERROR"}),
        ([], {"INVOCATION_ID": "x"}, {"INFO", "WARNING", "ERROR"}),
        (["--debug"], {}, {"DEBUG", "INFO", "WARNING", "ERROR"}),
    ],
)
def test_record_levels_on_stderr(monkeypatch, terminal_env, capsys, argv_head, env, shown):
    for name, value in env.items():
        monkeypatch.setenv(name, value)

    def load_config(path):
        logger = logging.getLogger("hpcsec.detector.config")
        for level in ("debug", "info", "warning", "error"):
            getattr(logger, level)("a %s record", level)
        return SiteConfig()

    monkeypatch.setattr(config_command, "load_config", load_config)
    assert cli.main([*argv_head, "config", "check", "site.yml"]) == 0
    err = capsys.readouterr().err
    assert {line.split(": ")[1] for line in err.splitlines()} == shown


def test_journal_priority_prefix_only_when_stderr_is_the_journal(monkeypatch, tmp_path):
    with open(tmp_path / "stderr", "w") as stream:
        st = os.fstat(stream.fileno())
        monkeypatch.setattr("sys.stderr", stream)
        log.setup(env={"JOURNAL_STREAM": f"{st.st_dev}:{st.st_ino}"})
        logging.getLogger("hpcsec.test").warning("disk full")
        log.setup(env={"JOURNAL_STREAM": "1:2"})
        logging.getLogger("hpcsec.test").warning("disk full")
    assert (tmp_path / "stderr").read_text() == (
        "<4>hpcsec: WARNING: disk full\nhpcsec: WARNING: disk full\n"
    )


def test_debug_is_a_global_option_only(terminal_env, capsys):
    with pytest.raises(SystemExit) as exit_:
        cli.main(["config", "--debug", "check", "site.yml"])
    assert exit_.value.code == 2


def test_log_path_follows_xdg_state_home(monkeypatch, tmp_path):
    assert str(log.log_path({"XDG_STATE_HOME": "/srv/state"})) == "/srv/state/hpcsec/hpcsec.log"
    monkeypatch.setenv("HOME", str(tmp_path))
    default = tmp_path / ".local" / "state" / "hpcsec" / "hpcsec.log"
    assert log.log_path({"XDG_STATE_HOME": "relative"}) == default
    assert log.log_path({}) == default

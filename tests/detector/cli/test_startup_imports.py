"""Commands that run often or on every job import only what they use.

`hpcsec slurm prolog` runs before every job; `--help`, `rules list` and `config check` are run
by hand (the last two parse the rules with pySigma's parser on a rule cache miss, and read
only the cached rule headers, without pySigma, on a hit). None of them may pull in DuckDB,
pySigma's plugin autodiscovery (every installed backend and validator, requests, jinja2) or the
packet and netlink libraries. Each command runs in a fresh interpreter and reports which heavy
modules ended up in sys.modules.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hpcsec.detector.cli.main import COMMANDS

HEAVY = (
    "duckdb",
    "sigma.plugins",
    "sigma.validation",
    "sigma.conversion.base",
    "sigma.processing.pipeline",
    "jinja2",
    "requests",
    "scapy",
    "pyroute2",
    "httpx",
    "pyarrow",
)
# pySigma's rule parser (and pyparsing under it): `rules list` and `config check` import it
# only to parse rules the rule cache does not hold
SIGMA_PARSER = ("sigma", "pyparsing")
# PyYAML: a config read before with the same bytes comes from the parsed-config cache, and rule
# files only need it on a rule cache miss
YAML = ("yaml",)
# imported only where used: orjson (with uuid and platform) by the JSON outputs, shutil (with bz2
# and lzma) by argparse's own help formatter, which the command line replaces; uuid reads a
# rule id that is not in the canonical form (engine/crossfile.py); difflib suggests a name for
# a config's unknown one
UNUSED_BY_READERS = ("orjson", "shutil", "bz2", "lzma", "uuid", "platform", "difflib")
# what only the epilog uses (Slurm commands, their parsers, the process readers) and what
# neither hook needs (socket for the host name, secrets for a temporary name)
UNUSED_BY_PROLOG = (
    "subprocess",
    "socket",
    "secrets",
    "shutil",
    "hpcsec.detector.slurm.jobs",
    "hpcsec.detector.slurm.parse",
    "hpcsec.sensors.procinfo",
)

# the standard library a short command does without: `logging` (with traceback, threading and
# weakref) is imported by whatever logs, and configured then (core/log.py); traceback only
# for a crash
UNUSED_BY_SHORT_COMMANDS = ("logging", "traceback")

PROBE = """
import contextlib, io, json, sys
from hpcsec.detector.cli.main import main
with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
    try:
        main(sys.argv[2:])
    except SystemExit:
        pass
with open(sys.argv[1], "w") as out:
    json.dump(sorted(sys.modules), out)
"""

SITE_CONFIG = Path(__file__).resolve().parents[3] / "examples" / "site-config.yml"


def imported_by(
    argv: list[str], tmp_path: Path, extra_env: dict[str, str] | None = None
) -> set[str]:
    """The modules a fresh `hpcsec ARGV` imported, with a rule cache of this test's own."""
    report = tmp_path / "modules.json"
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache"), **(extra_env or {})}
    subprocess.run(
        [sys.executable, "-c", PROBE, str(report), *argv],
        check=True,
        timeout=120,
        cwd=tmp_path,
        env=env,
    )
    return set(json.loads(report.read_text()))


def heavy_in(modules: set[str], names: tuple[str, ...]) -> list[str]:
    return sorted(n for n in names if n in modules or any(m.startswith(n + ".") for m in modules))


@pytest.mark.parametrize(
    "argv",
    [
        ["--help"],
        ["slurm", "prolog", "--state-dir", "{tmp}/state", "--host-name", "n1"],
        ["slurm", "epilog", "--state-dir", "{tmp}/state", "--host-name", "n1"],
    ],
    ids=["help", "slurm-prolog", "slurm-epilog"],
)
def test_light_commands_import_nothing_heavy(argv: list[str], tmp_path: Path) -> None:
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    modules = imported_by(argv, tmp_path)
    assert heavy_in(modules, HEAVY + SIGMA_PARSER + YAML + UNUSED_BY_SHORT_COMMANDS) == []


# what `hpcsec --help` (which imports no command module) does without besides: every command
# imports core/errors, core/display and core/log, and none of them needs these at run time
UNUSED_BY_HELP = ("typing", "dataclasses", "inspect", "hashlib", "datetime")


def test_help_imports_no_typing_dataclasses_or_hashlib(tmp_path: Path) -> None:
    assert heavy_in(imported_by(["--help"], tmp_path), UNUSED_BY_HELP) == []


# what no sub-command's --help may import: the store's database, the HTTP client, the packet and
# netlink libraries, Parquet (those are imported where the command runs)
NOT_FOR_HELP = ("duckdb", "httpx", "rich", "pyarrow", "scapy", "pyroute2", "jinja2", "requests")


@pytest.mark.parametrize("command", list(COMMANDS))
def test_no_command_help_imports_the_store_or_a_client(command: str, tmp_path: Path) -> None:
    """`hpcsec alerts --help` (and every other sub-command's) prints what the module registers
    without importing DuckDB or an HTTP client: those load where the command runs."""
    modules = imported_by([command, "--help"], tmp_path)
    assert f"hpcsec.detector.cli.{command}" in modules  # its own options were registered
    assert heavy_in(modules, NOT_FOR_HELP) == []


def test_the_prolog_imports_only_what_it_uses(tmp_path: Path) -> None:
    """Run as slurmd runs it (a job id in the environment): it records the job start and
    imports nothing of the epilog's checks."""
    state = tmp_path / "state"
    env = {"SLURM_JOB_ID": "77", "SLURM_JOB_UID": "1001", "SLURM_JOB_USER": "alice"}
    argv = ["slurm", "prolog", "--state-dir", str(state), "--host-name", "n1"]
    modules = imported_by(argv, tmp_path, env)
    assert (state / "jobs" / "77.json").exists()  # it did run
    assert heavy_in(modules, (*UNUSED_BY_PROLOG, "typing", "logging", "traceback")) == []


@pytest.mark.parametrize(
    "argv",
    [
        ["rules", "list"],
        ["rules", "--help"],
        ["config", "check", str(SITE_CONFIG)],
        ["rules", "list", "--config", str(SITE_CONFIG)],
    ],
    ids=["rules-list", "rules-help", "config-check", "rules-list-config"],
)
def test_rule_readers_import_the_parser_but_no_plugin(argv: list[str], tmp_path: Path) -> None:
    """`config check` reads the rules too: a list or threshold name no rule uses is an error.
    The first run parses them (pySigma's parser, no plugin); the next reads the rule cache's
    headers and imports no pySigma at all, and the site config's parsed document comes from
    its cache: no PyYAML either."""
    cold = imported_by(argv, tmp_path)
    assert "sigma.rule" in cold or argv == ["rules", "--help"]
    assert heavy_in(cold, HEAVY) == []
    warm = imported_by(argv, tmp_path)
    unused = HEAVY + SIGMA_PARSER + YAML + UNUSED_BY_READERS + UNUSED_BY_SHORT_COMMANDS
    assert heavy_in(warm, unused) == []


def test_rules_list_without_a_config_imports_no_config_parser(tmp_path: Path) -> None:
    """`rules list` with no --config lists the bundled rules (and --rules): the site config's
    parser is not imported; with --config it is, and the config's rules are listed too."""
    imported_by(["rules", "list"], tmp_path)  # fills the rule cache
    assert "hpcsec.detector.config.site" not in imported_by(["rules", "list"], tmp_path)
    with_config = imported_by(["rules", "list", "--config", str(SITE_CONFIG)], tmp_path)
    assert "hpcsec.detector.config.site" in with_config


def test_rules_list_defines_no_dataclass(tmp_path: Path) -> None:
    """The rule set's classes (engine/ruleset.py) are not dataclasses and --fields' choices are
    written out: `rules list` imports neither `dataclasses` (with inspect, ast and dis) nor the
    field tables. (`config check` still does, for the site config's classes.)"""
    imported_by(["rules", "list"], tmp_path)  # fills the rule cache
    modules = imported_by(["rules", "list"], tmp_path)
    assert heavy_in(modules, ("dataclasses", "inspect", "hpcsec.detector.engine.fieldmaps")) == []


COMPILED = """
import contextlib, io, json, sys
sources = []
def hook(event, args):  # text compiled, not a module's source read from its file
    if event == "compile" and args[1] == "<string>":
        source = args[0].decode() if isinstance(args[0], bytes) else str(args[0])
        sources.append(source[:40])
sys.addaudithook(hook)
from hpcsec.detector.cli.main import main
with contextlib.redirect_stdout(io.StringIO()):
    main(["rules", "list"])
print(json.dumps(sources))
"""


def test_rules_list_compiles_no_annotation(tmp_path: Path) -> None:
    """The rule header and the cache entry are NamedTuples in the functional form: typing
    compiles a class body's string annotations (each field's), and the first compile of a
    process builds Python's AST types. What is left is namedtuple's own `__new__`."""
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache")}
    for _ in range(2):  # fills the rule cache, then reads it
        done = subprocess.run(
            [sys.executable, "-c", COMPILED], env=env, capture_output=True, text=True, timeout=120
        )
    sources = json.loads(done.stdout)
    assert [s for s in sources if not s.startswith("lambda _cls")] == []


def test_rules_check_still_loads_the_validators(tmp_path: Path) -> None:
    """The plugins are imported where they are used: `rules check` still runs them."""
    modules = imported_by(["rules", "check"], tmp_path)
    assert "sigma.plugins" in modules and "sigma.validation" in modules


def test_help_lines_match_what_each_command_registers() -> None:
    """`hpcsec --help` lists COMMANDS without importing the modules; they must agree."""
    for name, text in COMMANDS.items():
        parser = argparse.ArgumentParser()
        sub = parser.add_subparsers()
        importlib.import_module(f"hpcsec.detector.cli.{name}").register(sub)
        (action,) = sub._choices_actions
        assert (action.dest, " ".join(action.help.split())) == (name, " ".join(text.split()))


@pytest.mark.parametrize("columns", ["50", "133", "", "junk"])
def test_help_is_wrapped_as_argparse_would_wrap_it(columns: str, monkeypatch) -> None:
    """The parser's own formatter (sized without importing shutil) lays out every sub-command's
    help exactly as argparse's formatter does for the same COLUMNS."""
    from hpcsec.detector.cli import main as cli

    monkeypatch.setenv("COLUMNS", columns)
    monkeypatch.setattr(cli._Formatter, "_columns", None)
    for name in COMMANDS:
        ours = cli.build_parser(name)
        theirs = cli.build_parser(name)
        stack = [theirs]
        while stack:  # every parser under it, with argparse's own formatter
            parser = stack.pop()
            parser.formatter_class = argparse.HelpFormatter
            for action in parser._subparsers._group_actions if parser._subparsers else ():
                stack.extend(action.choices.values())
        pairs = [(ours, theirs)]
        while pairs:
            a, b = pairs.pop()
            assert a.format_help() == b.format_help()
            if a._subparsers:
                (sub_a,) = a._subparsers._group_actions
                (sub_b,) = b._subparsers._group_actions
                pairs.extend((sub_a.choices[k], sub_b.choices[k]) for k in sub_a.choices)

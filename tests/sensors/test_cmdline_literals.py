"""A long command line keeps what the loaded rules look for: padding with distinct flags or
URLs pushed an indicator out of the condensed middle (12 KiB), whatever rule-blind choice the
sensor made; given the rules' literals it keeps those first."""

from __future__ import annotations

import io
import json
import subprocess
import sys

import pytest
from sigma.collection import SigmaCollection

from hpcsec.detector.config.site import load_config
from hpcsec.detector.engine.evaluate import Engine
from hpcsec.detector.engine.loader import load_rules
from hpcsec.detector.engine.ruleset import LoadedRule, RuleSet
from hpcsec.sensors import cmdline_condense
from tests.hostile_fs import as_root
from tests.sensors.test_proc_limits import (  # noqa: F401
    alice_runs,
    live_scan_alerts,
    wait_for_process,
)

RULES = """
title: Needs a pool and no benchmark
id: 0b0c6f4e-1c2d-4e5f-8a9b-0c1d2e3f4a5b
status: test
level: high
logsource: {product: hpc, category: process}
detection:
  pool:
    process.command_line|contains: ' --pool-url '
  wallet:
    process.args|contains|all: ['wallet=', 'xyz']
  short:
    process.command_line|contains: '-o'
  benchmark:
    process.command_line|contains: '--benchmark-only'
  condition: (pool or wallet or short) and not benchmark
---
title: Keyword and other fields
id: 1b0c6f4e-1c2d-4e5f-8a9b-0c1d2e3f4a5b
status: test
level: high
logsource: {product: hpc, category: process}
detection:
  keywords:
    - 'evil-keyword'
  name:
    process.name: 'not-a-command-line'
  condition: keywords or name
"""


def engine_of(text: str) -> Engine:
    rules = [LoadedRule(r, "<test>", 1, "test") for r in SigmaCollection.from_yaml(text)]
    return Engine(RuleSet(rules))


def test_the_literals_are_those_a_rule_needs_not_those_of_its_filter():
    literals = engine_of(RULES).command_line_literals()
    assert {" --pool-url ", "evil-keyword"} <= literals
    assert {"wallet=", "xyz"} & literals  # the index keeps one literal of an `all`
    assert "--benchmark-only" not in literals  # under a NOT: flooding with it must not win
    assert "-o" not in literals  # too short: most arguments show it
    assert "not-a-command-line" not in literals


def test_the_bundled_miner_rule_gives_its_pool_and_option_literals():
    engine = Engine(load_rules(None, with_tests=False), load_config(None).placeholders())
    literals = engine.command_line_literals()
    assert {"stratum+tcp://", " --donate-level", " --algo rx/"} <= literals


def condense(args: list[bytes], literals: cmdline_condense.Literals | None) -> list[bytes]:
    return cmdline_condense.cmdline_args(io.BytesIO(b"".join(a + b"\0" for a in args)), literals)


MINER = cmdline_condense.Literals(["stratum+tcp://", " --donate-level", " --algo rx/"])
HEAD = [b"A" * 100] * 330  # the head's 32 KiB
TAIL = [b"B" * 100] * 200  # more than the tail's 16 KiB


def test_distinct_flags_no_longer_push_out_a_rule_literal():
    flags = [f"-a{n:05d}".encode() for n in range(3000)]  # fill the middle first
    args = [b"./x", *HEAD, *flags, b"--donate-level=1", *TAIL]
    assert b"--donate-level=1" not in condense(args, None)  # the blind spot
    kept = condense(args, MINER)
    assert b"--donate-level=1" in kept
    assert len(b"\0".join(kept)) < cmdline_condense.CMDLINE_MAX
    assert condense(kept, MINER) == kept  # a snapshot replays the same event


def test_distinct_urls_no_longer_push_out_the_pool_url():
    urls = [f"http://h{n:05d}.example/".encode() for n in range(1000)]  # 12 KiB of URLs
    args = [b"./x", *HEAD, *urls, b"stratum+tcp://pool:3333", *TAIL]
    assert b"stratum+tcp://pool:3333" not in condense(args, None)
    assert b"stratum+tcp://pool:3333" in condense(args, MINER)


def test_a_literal_of_two_words_is_kept_across_its_two_arguments():
    flags = [f"-a{n:05d}".encode() for n in range(3000)]
    args = [b"./x", *HEAD, *flags, b"--algo", b"rx/0", *TAIL]
    joined = b" ".join(condense(args, MINER))
    assert b" --algo rx/0 " in joined
    assert b" --algo rx/0 " not in b" ".join(condense(args, None))


def test_a_literal_deep_in_a_long_argument_is_kept_as_an_excerpt():
    flags = [f"-a{n:05d}".encode() for n in range(3000)]
    long_arg = b"x" * 20_000 + b"stratum+tcp://deep:1" + b"y" * 20_000
    kept = condense([b"./x", *HEAD, *flags, long_arg, *TAIL], MINER)
    (excerpt,) = [arg for arg in kept if b"stratum+tcp://deep:1" in arg]
    assert len(excerpt) < 200 and cmdline_condense.is_condensed([excerpt])


def test_flooding_with_the_literal_keeps_it_once_and_stays_bounded():
    args = [b"./x", *HEAD, *([b"--donate-level=9"] * 20_000), *TAIL]
    kept = condense(args, MINER)
    assert kept.count(b"--donate-level=9") == 1
    assert len(b"\0".join(kept)) < cmdline_condense.CMDLINE_MAX


def test_arguments_kept_for_the_literals_leave_the_flags_their_share_of_the_middle():
    """A user who writes every literal the rules hold, one per argument, takes at most
    COVER_MAX of the middle with them: the flags that follow still get the rest."""
    literals = cmdline_condense.Literals([f"zlit{n:05d}" for n in range(1500)])
    shown = [f"zlit{n:05d}".encode() for n in range(1500)]  # 15 KB, more than the middle
    flags = [f"-f{n:04d}".encode() for n in range(1000)]  # 7 KB, more than the rest
    kept = condense([b"./x", *HEAD, *shown, *flags, *TAIL], literals)
    for_literals = sum(len(a) + 1 for a in kept if a.startswith(b"zlit"))
    assert cmdline_condense.COVER_MAX - 20 < for_literals <= cmdline_condense.COVER_MAX
    # the flags' share: a third of the middle (COVER_MAX is two thirds of it)
    kept_flags = [a for a in kept if a.startswith(b"-f")]
    assert len(kept_flags) * 7 > cmdline_condense.MIDDLE_MAX // 3 - 512


def test_a_literal_past_the_cut_of_a_long_head_argument_is_kept():
    """`bash -c` with a 40 KB script: the head keeps its first ARG_KEEP bytes only, and the
    miner at its end is kept as an excerpt in the middle; condensing again changes nothing."""
    script = b"echo " + b"x" * 40_000 + b"; ./xmrig -o stratum+tcp://pool:3333"
    args = [b"bash", b"-c", script, *TAIL, *TAIL]  # 80 KB in all: condensed
    assert all(b"stratum+tcp://pool" not in a for a in condense(args, None))  # the blind spot
    kept = condense(args, MINER)
    (excerpt,) = [a for a in kept if b"stratum+tcp://pool" in a]
    assert len(excerpt) < 200 and cmdline_condense.is_condensed([excerpt])
    assert kept[2].startswith(b"echo xxx") and len(kept[2]) < cmdline_condense.ARG_KEEP + 64
    assert condense(kept, MINER) == kept


@pytest.mark.parametrize(
    ("pad", "after"),
    [
        (40_000, [*TAIL, *TAIL]),  # the head closes on the arguments after the script
        (70_000, [*TAIL]),  # a script longer than CMDLINE_MAX: its first 64 KiB are looked at
        (40_000, [b"C" * 30_000]),  # a head that never closes: two long arguments, 8 KB kept
    ],
)
def test_a_literal_past_the_cut_of_a_head_argument_is_kept_however_the_head_ends(pad, after):
    script = (
        b"echo " + b"x" * (pad // 2) + b"; ./xmrig -o stratum+tcp://pool:3333 " + b"y" * (pad // 2)
    )
    kept = condense([b"bash", b"-c", script, *after], MINER)
    assert [a for a in kept if b"stratum+tcp://pool" in a]
    assert condense(kept, MINER) == kept


def test_a_literal_the_head_shows_is_not_kept_again_from_a_long_head_argument():
    shown = b"./xmrig --donate-level=1"  # in the head, within its kept bytes
    script = b"echo " + b"x" * 40_000 + b"; --donate-level=1"
    kept = condense([shown, b"-c", script, *TAIL, *TAIL], MINER)
    assert [a for a in kept if b"donate-level" in a] == [shown]


@as_root
def test_a_padded_miner_still_raises_the_alert_in_a_live_scan(alice_runs):  # noqa: F811
    """Alice's miner, renamed `python3`, its `--donate-level` behind 44 KiB of distinct flags:
    `scan` gives the process sensor the rules' literals, so the option stays in the command
    line the miner rule reads."""
    tag = "hpcsec-tag-16180"
    sleeper = "import time; time.sleep(120)"
    flags = [f"-a{n:05d}" for n in range(8000)]
    alice_runs(
        "/usr/bin/python3", "-c", sleeper, tag, *flags, "--donate-level=1", *(["B" * 100] * 200)
    )
    event = wait_for_process(tag, "python3")
    mine = live_scan_alerts(event["process.pid"])
    assert "Cryptocurrency miner process" in [a["rule.title"] for a in mine]
    (miner,) = [a for a in mine if a["rule.title"] == "Cryptocurrency miner process"]
    assert " --donate-level=1" in miner["process.command_line"]


def collected(*extra: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """`hpcsec collect --sensor process` on this node."""
    command = [sys.executable, "-m", "hpcsec.detector.cli.main", "collect", "--sensor"]
    return subprocess.run(
        [*command, "process", *extra],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )


@as_root
def test_collect_keeps_what_the_rules_look_for_in_a_padded_command_line(alice_runs, tmp_path):  # noqa: F811
    """A snapshot `collect` records is what a later scan reads: it keeps the option the
    miner rule looks for behind 44 KiB of distinct flags, as a live scan does. Rules given
    with --rules must load (exit 2, file and line); a config's rules that cannot are said,
    and collect goes on (flags and URLs first then)."""
    tag = "hpcsec-tag-14142"
    flags = [f"-a{n:05d}" for n in range(8000)]
    sleeper = "import time; time.sleep(120)"
    alice_runs(
        "/usr/bin/python3", "-c", sleeper, tag, *flags, "--donate-level=1", *(["B" * 100] * 200)
    )
    pid = wait_for_process(tag, "python3")["process.pid"]

    def line_of(run: subprocess.CompletedProcess) -> str:
        assert run.returncode == 0, run.stderr
        events = [json.loads(line) for line in run.stdout.splitlines()]
        (event,) = [e for e in events if e.get("process.pid") == pid]
        return event["process.command_line"]

    assert " --donate-level=1" in line_of(collected())
    broken = tmp_path / "broken.yml"
    broken.write_text("title: [unclosed\n")
    refused = collected("--rules", str(broken))
    assert refused.returncode == 2 and "broken.yml:" in refused.stderr
    assert "Traceback" not in refused.stderr
    config = tmp_path / "site.yml"
    config.write_text(f"rules: [{broken}]\n")
    went_on = collected("--config", str(config))
    assert "rules not loaded" in went_on.stderr and "broken.yml" in went_on.stderr
    assert " --donate-level=1" not in line_of(went_on)  # the flags pushed it out


@pytest.mark.parametrize(
    "sensor, loads",
    [("process", True), ("gpu", True), ("rdma_counters", False), ("firmware", False)],
)
def test_collect_loads_the_rules_only_for_a_sensor_that_reads_command_lines(
    tmp_path, sensor, loads
):
    """Only command lines keep the rules' literals: for a sensor whose events hold none,
    collect loads no rules (0.2 s and some 50 modules), so a config's broken rule file goes
    unsaid; one given with --rules is still refused (exit 2), whatever the sensor."""
    broken = tmp_path / "broken.yml"
    broken.write_text("title: [unclosed\n")
    config = tmp_path / "site.yml"
    config.write_text(f"rules: [{broken}]\n")
    empty = tmp_path / "node"
    empty.mkdir()
    roots = ["--sysfs-root", str(empty), "--procfs-root", str(empty), "--etc-root", str(empty)]
    command = [sys.executable, "-m", "hpcsec.detector.cli.main", "collect", "--sensor", sensor]

    def collect(*extra: str) -> subprocess.CompletedProcess:
        run = [*command, *roots, "--raw", *extra]
        return subprocess.run(run, capture_output=True, text=True, timeout=120)

    went_on = collect("--config", str(config))
    assert went_on.returncode == 0, went_on.stderr
    assert ("rules not loaded" in went_on.stderr) is loads, went_on.stderr
    refused = collect("--rules", str(broken))
    assert refused.returncode == 2 and "broken.yml:" in refused.stderr
    assert "Traceback" not in refused.stderr


def test_an_argument_with_two_literals_far_apart_does_not_turn_the_literals_off():
    """`xmrig` + 9 KB + `jupyter` in one argument: one excerpt of both would not fit the
    literals' room; it is kept around one of them, and a later `--algo rx/0` still is."""
    literals = cmdline_condense.Literals(["xmrig", "jupyter", " --algo rx/", "stratum+tcp://"])
    flags = [b"-a%05d" % n for n in range(2000)]
    real = [b"--algo", b"rx/0", b"-o", b"stratum+tcp://pool:3333"]
    poison = b"xmrig" + b"q" * 9000 + b"jupyter"
    joined = b" ".join(condense([b"./run", *HEAD, *flags, poison, *real, *TAIL], literals))
    assert b" --algo rx/0 " in joined and b"stratum+tcp://pool:3333" in joined
    assert b"xmrig" in joined or b"jupyter" in joined


def test_a_literal_across_two_arguments_left_out_is_kept_where_it_comes_again():
    """The literals' room nearly full, a decoy ` --algo` / `rx/0` whose first argument is too
    long for it is left out: the literal must not count as kept, so the later short copy is."""
    fillers = [f"lit{n:03d}" for n in range(89)]
    literals = cmdline_condense.Literals([" --algo rx/", *fillers])
    fill = [f.encode() + b"z" * 94 for f in fillers[:80]] + [f.encode() for f in fillers[80:]]
    flags = [b"-a%05d" % n for n in range(2000)]
    decoy = [b"q" * 1000 + b" --algo", b"rx/0"]
    args = [b"./run", *HEAD, *fill, *flags, *decoy, *([b"P" * 100] * 800), b"--algo", b"rx/0"]
    assert b" --algo rx/0" in b" ".join(condense([*args, *TAIL], literals))


def test_a_rule_literal_no_argument_can_show_is_skipped():
    """A rule's `\\ud800abc` (valid YAML, loaded without error) made the agent's start fail."""
    literals = cmdline_condense.Literals(["\ud800abc", "xmrig"])
    assert literals.found(b"./xmrig") and not literals.found(b"abc")

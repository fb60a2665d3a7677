"""A sample's command lines are bounded per owner (sensors/cmdline_budget.py): one user's
hundreds of padded processes cost that user's command lines, not the agent's memory, and
neither the rules' texts in them nor another user's command lines."""

from __future__ import annotations

import json

from snapshot_builder import NodeTree

from hpcsec.detector.cli.main import main
from hpcsec.sensors import cmdline_budget
from hpcsec.sensors.cmdline_condense import Literals, is_condensed
from hpcsec.sensors.process import ProcessSensor

PADDING = [f"--opt{n}={'p' * 200}" for n in range(300)]  # 61 KiB: one command line, kept whole
POOL = "stratum+tcp://pool.example:3333"
MINER_RULE = "743946f7-19b5-40ca-97f8-197cf6f01537"  # rules/gpu_hijack.yml


def sleepers(tmp_path) -> NodeTree:
    """alice: 40 sleepers, then a miner named python3 whose pool is past 60 KiB of padding,
    one whose arguments are not UTF-8 (each byte 4 characters of text); bob: one process
    with as long a command line."""
    node = NodeTree(tmp_path)
    node.passwd(("root", 0), ("alice", 1001), ("bob", 1002))
    for pid in range(1000, 1040):
        node.process(pid, "napper", ["/tmp/napper", *PADDING], uid=1001)
    node.process(1040, "python3", ["/usr/bin/python3", *PADDING, "-o", POOL], uid=1001)
    binary = node.process(1041, "napper", ["/tmp/napper"], uid=1001)
    (binary / "cmdline").write_bytes(b"/tmp/napper\0" + b"\xff" * 30_000 + b"\0")
    node.process(2000, "train", ["/usr/bin/python3", *PADDING], uid=1002)
    return node


def test_an_owners_command_lines_past_its_budget_keep_their_head_and_the_rules_texts(tmp_path):
    ctx = sleepers(tmp_path).context()
    ctx.cmdline_literals = Literals(["stratum+tcp://", " --donate-level"])
    events = {e["process.pid"]: e for e in ProcessSensor().collect(ctx)}
    alice = [e for e in events.values() if e["user.id"] == 1001]
    text = sum(len(e["process.command_line"]) + sum(map(len, e["process.args"])) for e in alice)
    assert text < 2 * cmdline_budget.OWNER_BUDGET + 42 * 4 * cmdline_budget.HEAD_KEEP
    whole = [e for e in alice if not e.get("process.command_line_truncated")]
    assert 10 <= len(whole) <= 17  # what fits 1 MiB, in pid order
    miner = events[1040]
    assert miner["process.command_line_truncated"] is True and is_condensed(miner["process.args"])
    assert POOL[:14] in miner["process.command_line"]  # the rule's text, as an excerpt
    assert miner["process.command_line"].startswith("/usr/bin/python3 --opt0=")
    assert "arguments (" in miner["process.args"][-1]
    binary = events[1041]["process.command_line"]
    assert len(binary) < 5 * cmdline_budget.HEAD_KEEP  # 1 KiB, each byte 4 characters
    assert binary.startswith("/tmp/napper \\xff")
    assert "process.command_line_truncated" not in events[2000]  # bob's budget is his own
    assert events[2000]["process.args"][1:] == PADDING


def test_the_miner_behind_the_padded_sleepers_still_alerts(tmp_path, capsys):
    node = sleepers(tmp_path)
    argv = ["scan", "--procfs-root", str(node.proc), "--etc-root", str(node.etc)]
    argv += ["--sysfs-root", str(node.sys), "--sensor", "process", "--format", "jsonl"]
    assert main(argv) == 1
    alerts = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    miner = [a["rule.id"] for a in alerts if a.get("process.pid") == 1040]
    assert miner == [MINER_RULE]  # by its command line alone: it is named python3


def test_a_short_command_line_past_the_budget_is_kept_as_it_is():
    budget = cmdline_budget.CommandLineBudget(None)
    budget.spent["alice"] = cmdline_budget.OWNER_BUDGET
    assert budget.args("alice", [b"ls", b"-l", b"\xff"]) == (["ls", "-l", "\\xff"], False)
    assert budget.shortened == 0

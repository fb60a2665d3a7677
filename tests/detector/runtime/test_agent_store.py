"""`hpcsec agent` with a store, as a real process: it appends journal segments and never loads
DuckDB; `hpcsec alerts` then shows every alert with its disposition and delivery state, and
the events, from what the agent wrote."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from hpcsec.detector.core.schema import new_event, rfc3339
from hpcsec.detector.runtime.metrics import AgentMetrics
from hpcsec.detector.runtime.sink import AlertSink
from hpcsec.detector.store.alert_store import Store
from hpcsec.detector.store.journal import JournalWriter, journal_dir
from tests.detector.runtime.agent_harness import (
    RULE_A_ID,
    RULE_B_ID,
    AgentProcess,
    Node,
    Receiver,
    rule,
    wait_for,
)
from tests.slurm_harness import ensure_users


@pytest.fixture
def node(tmp_path: Path) -> Node:
    return Node(tmp_path)


def hpcsec(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "hpcsec.detector", *args], capture_output=True, text=True
    )


def test_agent_journal_reaches_hpcsec_alerts_with_dispositions_and_deliveries(node: Node):
    receiver = Receiver()
    (node.rules / "test.yml").write_text(
        rule(RULE_A_ID, "cryptominer") + "---\n" + rule(RULE_B_ID, "otherminer")
    )
    node.config.write_text("dedup_window_s: 86400\nsilences: [{user: u5, comment: bench}]\n")
    store = node.root / "store.duckdb"
    journal = Path(str(store) + ".journal")
    # both before the agent starts: one sample sees both (the test waits for u1's alert only)
    node.start_process(4242, "cryptominer", 1)
    node.start_process(4246, "otherminer", 5)  # silenced: stored, not sent
    agent = AgentProcess(node, "--output", receiver.url, "--store", str(store))
    try:
        wait_for(lambda: receiver.received, "the webhook delivery", check=agent)
        maps = Path(f"/proc/{agent.proc.pid}/maps").read_text()
        assert "duckdb" not in maps  # the memory budget: no DuckDB in the agent
        assert agent.stop() == 0
    finally:
        agent.kill()
        receiver.stop()
    assert not store.exists()  # only the journal was written
    assert stat.S_IMODE(journal.stat().st_mode) == 0o700
    segments = sorted(journal.iterdir())
    assert segments and {stat.S_IMODE(p.stat().st_mode) for p in segments} == {0o600}

    shown = hpcsec("alerts", "--store", str(store), "--format", "json")
    assert shown.returncode == 0, shown.stderr
    alerts = {a["rule.id"]: a for a in json.loads(shown.stdout)}
    sent, silenced = alerts[RULE_A_ID], alerts[RULE_B_ID]
    assert (sent["hpcsec.disposition"], sent["user.name"]) == ("sent", "u1")
    assert "delivered" in sent["hpcsec.deliveries"].values()
    assert (silenced["hpcsec.disposition"], silenced["user.name"]) == ("silenced", "u5")
    assert silenced["hpcsec.deliveries"] == {}
    assert list(journal.iterdir()) == []  # applied, then deleted
    with Store(store, read_only=True) as db:
        assert db.count("events") >= 2
        assert db.count("deliveries") >= 2  # the webhook and the JSONL file


def test_the_agents_hourly_applier_moves_the_journal_into_duckdb(node: Node, tmp_path: Path):
    """`hpcsec alerts --apply`, as the agent runs it: the journal empties into the store."""
    (node.rules / "test.yml").write_text(rule(RULE_A_ID, "cryptominer"))
    store = node.root / "store.duckdb"
    agent = AgentProcess(node, "--store", str(store))
    try:
        node.start_process(4242, "cryptominer", 1)
        wait_for(node.file_alerts, "the alert", check=agent)
        assert agent.stop() == 0
    finally:
        agent.kill()
    journal = Path(str(store) + ".journal")
    assert list(journal.iterdir())
    done = hpcsec("alerts", "--store", str(store), "--apply", "--retention-days", "7")
    assert done.returncode == 0, done.stderr
    assert list(journal.iterdir()) == []
    with Store(store, read_only=True) as db:
        assert db.count("alerts") == 1
        assert db.count("events") >= 1


def test_a_journal_directory_planted_by_a_user_is_refused(node: Node):
    """A user who can create `<store>.journal` first (a shared parent directory) must not get
    the agent's events: the agent refuses to start with that store and says why."""
    if os.geteuid() != 0:
        pytest.skip("needs root to act as another user")
    ensure_users()
    shared = Path(tempfile.mkdtemp(prefix="hpcsec-shared-"))  # the test's tree is root-only
    shared.chmod(0o1777)
    store = shared / "store.duckdb"
    try:
        _refused(node, store)
    finally:
        shutil.rmtree(shared)


def _refused(node: Node, store: Path) -> None:
    planted = subprocess.run(
        ["runuser", "-u", "alice", "--", "mkdir", "-m", "0700", f"{store}.journal"],
        capture_output=True,
        text=True,
    )
    assert planted.returncode == 0, planted.stderr
    (node.rules / "test.yml").write_text(rule(RULE_A_ID, "cryptominer"))
    argv = [sys.executable, "-m", "hpcsec.detector", "agent", "--store", str(store)]
    argv += ["--no-default-rules", "--rules", str(node.rules), "--etc-root", str(node.etc)]
    argv += ["--procfs-root", str(node.proc), "--sensor", "process"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert "refusing store journal" in done.stderr and "not by us" in done.stderr


def test_the_sinks_applier_child_empties_the_journal(tmp_path: Path):
    """What the agent does every hour: flush to the journal, then `apply_store` starts the
    `hpcsec alerts --apply` child, which moves the segment into DuckDB."""
    store = tmp_path / "store.duckdb"
    sink = AlertSink(None, JournalWriter(store, retention_days=7), AgentMetrics())
    event = new_event("process", "start", "process", "gpu-007", rfc3339(), {"process.pid": 4242})
    sink.keep_events([event])
    sink.flush_store()
    assert len(list(journal_dir(store).iterdir())) == 1
    sink.apply_store()
    assert sink._applier is not None and sink._applier.wait(timeout=60) == 0
    assert list(journal_dir(store).iterdir()) == []
    with Store(store, read_only=True) as db:
        assert db.count("events") == 1

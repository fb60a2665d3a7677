"""`hpcsec agent` as a real process with its spool and store on a full disk (a real tmpfs):
it keeps alerting, sends what it cannot spool directly, says so (a self-health status event,
metrics, the journal), and after the disk is freed and a restart nothing is sent twice."""

from __future__ import annotations

import os
import shutil
import socket
from collections import Counter
from pathlib import Path

import pytest

from tests.detector.runtime.agent_harness import (
    RULE_A_ID,
    AgentProcess,
    Node,
    Receiver,
    rule,
    wait_for,
)
from tests.ports import refusing_port
from tests.tinydisk import tiny_disk

SELF_HEALTH_RULES = Path(__file__).resolve().parents[3] / "rules" / "self_health.yml"


def crypto(node: Node) -> list[dict]:
    return [a for a in node.file_alerts() if a["rule.id"] == RULE_A_ID]


@pytest.fixture
def node(tmp_path: Path) -> Node:
    return Node(tmp_path)


def test_agent_on_a_full_disk_keeps_alerting_and_sends_nothing_twice(node: Node):
    (node.rules / "test.yml").write_text(rule(RULE_A_ID, "cryptominer"))
    shutil.copy(SELF_HEALTH_RULES, node.rules / "self_health.yml")
    receiver = Receiver()
    with tiny_disk(node.root / "disk", size="1m") as disk:
        node.spool = disk.path / "spool"
        store = str(disk.path / "alerts.duckdb")
        args = ["--output", receiver.url, "--spool", str(node.spool), "--store", store]
        agent = AgentProcess(node, *args)
        try:
            disk.fill()
            for user in range(1, 6):
                node.start_process(5000 + user, "cryptominer", user)
            wait_for(lambda: len(crypto(node)) == 5, "5 alerts", check=agent)
            wait_for(lambda: len(receiver.received) >= 5, "5 deliveries", check=agent)
            unspooled = [
                v for k, v in agent.metrics().items() if k.startswith("hpcsec_alerts_unspooled")
            ]
            assert sum(unspooled) >= 5
            for user in range(1, 6):
                node.end_process(5000 + user)
            disk.free()
            node.start_process(5006, "cryptominer", 6)
            wait_for(lambda: len(crypto(node)) == 6, "the 6th alert", check=agent)
            node.end_process(5006)  # a restart forgets dedup: it would rightly alert again
            assert agent.stop() == 0
        finally:
            agent.kill()
        assert "could not be spooled, sent directly" in agent.text()
        assert "self-health alert: Alert spool cannot be written or is corrupt" in agent.text()
        restarted = AgentProcess(node, *args)
        try:
            assert restarted.stop() == 0
        finally:
            restarted.kill()
    receiver.stop()
    assert "Alert spool cannot be written or is corrupt" in {
        a["rule.title"] for a in node.file_alerts()
    }
    assert Counter(receiver.received) == Counter(a["alert.id"] for a in node.file_alerts())
    assert set(Counter(receiver.received).values()) == {1}
    assert receiver.bad_signatures == 0


def test_an_agent_stopped_on_a_full_disk_says_which_alerts_are_lost(node: Node):
    """Alerts the spool could not take are held in memory: at exit they are lost (the agent
    has nothing to evaluate again), which its log says, not "kept in the spool"."""
    (node.rules / "test.yml").write_text(rule(RULE_A_ID, "cryptominer"))
    with tiny_disk(node.root / "disk", size="1m") as disk:
        node.spool = disk.path / "spool"
        url = f"http://127.0.0.1:{refusing_port()}/hook"  # the receiver is down
        agent = AgentProcess(node, "--output", url, "--spool", str(node.spool))
        try:
            disk.fill()
            node.start_process(5001, "cryptominer", 1)
            wait_for(lambda: len(crypto(node)) == 1, "the alert", check=agent)
            assert agent.stop() == 0
        finally:
            agent.kill()
    assert "1 alert(s) not delivered and lost: the spool could not take them" in agent.text()
    assert "kept in the spool" not in agent.text()


def _threads(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/task"))


def test_500_idle_metrics_connections_start_no_thread_and_alerts_still_flow(node: Node):
    """Any local user can connect to the metrics port: 500 connections that never send a
    byte do not grow the agent's threads (the unit's TasksMax would kill it), /metrics still
    answers, and the next alert is delivered."""
    (node.rules / "test.yml").write_text(rule(RULE_A_ID, "cryptominer"))
    receiver = Receiver()
    agent = AgentProcess(node, "--output", receiver.url)
    idle: list[socket.socket] = []
    try:
        host, port = agent.metrics_url.removeprefix("http://").split("/")[0].rsplit(":", 1)
        agent.metrics()
        before = _threads(agent.proc.pid)
        for _ in range(500):
            idle.append(socket.create_connection((host, int(port)), timeout=5))
        assert "hpcsec_queue_depth" in "".join(agent.metrics())
        node.start_process(5001, "cryptominer", 1)
        wait_for(lambda: len(receiver.received) == 1, "the alert", check=agent)
        assert _threads(agent.proc.pid) <= before + 1
        assert agent.stop() == 0
    finally:
        for sock in idle:
            sock.close()
        agent.kill()
        receiver.stop()

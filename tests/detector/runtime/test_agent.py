"""`hpcsec agent` as a real process: a procfs tree of the test (processes appear and vanish as
the test writes them), rules in a temp dir, a JSONL file output and a signed webhook to a real
HTTP server in the test; SIGHUP reloads, SIGTERM drains, kill -9 loses nothing."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from pathlib import Path

import orjson
import pytest

from hpcsec.detector.cli import main as cli
from hpcsec.detector.core.schema import new_event, parse_time
from hpcsec.detector.outputs.protocol import redact
from hpcsec.detector.runtime.agent import Agent, AgentSettings
from hpcsec.detector.runtime.pipeline import SourceBatch
from hpcsec.detector.runtime.threads import EventQueue
from hpcsec.detector.store.alert_store import AlertQuery, Store
from tests.detector.runtime.agent_harness import (
    BROKEN_RULE,
    RULE_A_ID,
    RULE_B_ID,
    SYSFS_FIXTURE,
    AgentProcess,
    Node,
    Receiver,
    rule,
    wait_for,
)


@pytest.fixture
def node(tmp_path: Path) -> Node:
    return Node(tmp_path)


def test_agent_alerts_reload_metrics_and_sigterm(node: Node):
    receiver = Receiver()
    (node.rules / "test.yml").write_text(rule(RULE_A_ID, "cryptominer"))
    node.start_process(4242, "cryptominer", 1)
    store = node.root / "store.duckdb"
    node.config.write_text(
        "dedup_window_s: 86400\nsilences: [{user: u5, comment: benchmark account}]\n"
    )
    # The RDMA counters of the 4-HCA fixture node are sampled alongside (4 ports a sample).
    agent = AgentProcess(
        node,
        "--output",
        receiver.url,
        "--store",
        str(store),
        "--sensor",
        "rdma_counters",
        "--sysfs-root",
        str(SYSFS_FIXTURE),
    )
    try:
        first = wait_for(node.file_alerts, "the first alert", check=agent)
        assert [(a["rule.id"], a["user.name"], a["process.pid"]) for a in first] == [
            (RULE_A_ID, "u1", 4242)
        ]
        wait_for(lambda: receiver.received, "the webhook delivery", check=agent)
        assert receiver.received == [first[0]["alert.id"]]
        assert receiver.bad_signatures == 0
        node.end_process(4242)  # alerted: no other dedup window may raise it again

        shown = redact(receiver.url)  # metrics name no webhook path or token
        delivered = f'hpcsec_alerts_delivered_total{{destination="{shown}"}}'
        spooled = f'hpcsec_spool_depth{{destination="{shown}"}}'

        def settled() -> dict | None:
            # the receiver notes an alert before it answers; the agent counts it once answered
            metrics = agent.metrics()
            return metrics if metrics.get(delivered) == 1 and metrics.get(spooled) == 0 else None

        metrics = wait_for(settled, "the delivery in the metrics", check=agent)
        assert metrics['hpcsec_events_total{sensor="process"}'] >= 1
        rdma = metrics['hpcsec_events_total{sensor="rdma_counters"}']
        assert rdma >= 4 and rdma % 4 == 0
        assert metrics['hpcsec_sensor_up{sensor="rdma_counters"}'] == 1
        assert metrics['hpcsec_sensor_state{sensor="rdma_counters",state="ok"}'] == 1
        assert metrics['hpcsec_alerts_total{disposition="sent",level="high",vector="test"}'] == 1
        assert metrics["hpcsec_rules_loaded"] == 1
        assert metrics["hpcsec_rule_evaluation_seconds_count"] >= 1
        assert 0 <= metrics["hpcsec_last_sample_age_seconds"] < 30

        # A broken rule: the old set keeps running, and the failure is an alert.
        rule_file = node.rules / "test.yml"
        rule_file.write_text(BROKEN_RULE)
        agent.signal(signal.SIGHUP)
        failed = wait_for(
            lambda: [a for a in node.file_alerts() if a["rule.id"] == "hpcsec-reload-failed"],
            "the reload-failed alert",
            check=agent,
        )
        assert failed[0]["rule.level"] == "high"
        assert (
            f"{rule_file}:10: condition syntax error in 'selection and'"
            in failed[0]["alert.summary"]
        )
        assert (
            f"reload failed, the previous rules and config keep running: {rule_file}:10:"
            in agent.text()
        )
        node.start_process(4243, "cryptominer", 2)
        wait_for(
            lambda: any(a.get("user.name") == "u2" for a in node.file_alerts()),
            "an alert of the old rule after the failed reload",
            check=agent,
        )
        node.end_process(4243)
        assert agent.metrics()['hpcsec_reloads_total{outcome="failed"}'] == 1

        # A good new rule replaces the old one.
        rule_file.write_text(rule(RULE_B_ID, "otherminer"))
        agent.signal(signal.SIGHUP)
        wait_for(lambda: "reloaded: 1 rules" in agent.text(), "the reload", check=agent)
        node.start_process(4244, "otherminer", 3)
        node.start_process(4245, "cryptominer", 4)
        node.start_process(4246, "otherminer", 5)  # silenced: stored, not sent
        wait_for(
            lambda: any(a["rule.id"] == RULE_B_ID for a in node.file_alerts()),
            "an alert of the new rule",
            check=agent,
        )
        time.sleep(0.7)  # two more samples: the old rule must not fire on u4

        # A broken config is refused the same way.
        node.config.write_text(
            "dedup_window_s: 86400\n"
            "silences: [{user: u5, comment: benchmark account}]\n"
            "rate_limit_per_rule: soon\n"
        )
        agent.signal(signal.SIGHUP)
        wait_for(
            lambda: (
                len([a for a in node.file_alerts() if a["rule.id"] == "hpcsec-reload-failed"]) == 2
            ),
            "the second reload-failed alert",
            check=agent,
        )
        assert (
            f"{node.config}:3: rate_limit_per_rule must be a number, not 'soon'"
            in node.file_alerts()[-1]["alert.summary"]
        )
        assert agent.metrics()['hpcsec_reloads_total{outcome="failed"}'] == 2
        assert agent.stop() == 0
    finally:
        agent.kill()
        receiver.stop()

    alerts = node.file_alerts()
    by_rule = sorted((a["rule.id"], a.get("user.name")) for a in alerts)
    assert by_rule == [
        (RULE_A_ID, "u1"),
        (RULE_A_ID, "u2"),
        (RULE_B_ID, "u3"),
        ("hpcsec-reload-failed", None),
        ("hpcsec-reload-failed", None),
    ]
    # Every alert went to the webhook too, exactly once, in time for the SIGTERM drain.
    assert sorted(receiver.received) == sorted(a["alert.id"] for a in alerts)
    assert receiver.bad_signatures == 0
    assert "stopped" in agent.text()
    with Store(store, read_only=True) as db:
        stored = db.query_alerts(AlertQuery())
        sent = [a for a in stored if a["hpcsec.disposition"] == "sent"]
        assert sorted(a["alert.id"] for a in sent) == sorted(a["alert.id"] for a in alerts)
        (silenced,) = [a for a in stored if a["hpcsec.disposition"] == "silenced"]
        assert (silenced["rule.id"], silenced["user.name"]) == (RULE_B_ID, "u5")
        assert db.count("events") >= 4


def test_receiver_outages_and_kill9_lose_nothing(node: Node):
    """Receiver up, down (alerts wait in the spool), up again (the same agent sends them),
    down again, agent killed with -9 while alerts wait, receiver up, agent restarted: the
    receiver has every alert exactly once."""
    (node.rules / "test.yml").write_text(rule(RULE_A_ID, "cryptominer"))
    received: list[str] = []
    receiver = Receiver()
    port, url = receiver.port, receiver.url
    depth = f'hpcsec_spool_depth{{destination="{redact(url)}"}}'

    def raise_alerts(agent: AgentProcess, users: tuple[int, ...], total: int) -> None:
        for user in users:
            node.start_process(5000 + user, "cryptominer", user)
        wait_for(lambda: len(node.file_alerts()) == total, f"{total} alerts", check=agent)
        for user in users:  # alerted: gone, so that no later sample raises them again
            node.end_process(5000 + user)

    agent = AgentProcess(node, "--output", url)
    try:
        raise_alerts(agent, (1,), 1)
        wait_for(lambda: len(receiver.received) == 1, "the first delivery", check=agent)
        received += receiver.received
        receiver.stop()
        raise_alerts(agent, (2, 3), 3)
        wait_for(lambda: agent.metrics().get(depth) == 2, "two spooled alerts", check=agent)
        receiver = Receiver(port)
        wait_for(lambda: len(receiver.received) == 2, "the retried alerts", check=agent)
        received += receiver.received
        receiver.stop()
        raise_alerts(agent, (4, 5), 5)
        wait_for(lambda: agent.metrics().get(depth) == 2, "two spooled alerts", check=agent)
        assert node.spooled() == sorted(a["alert.id"] for a in node.file_alerts()[3:])
    finally:
        agent.proc.kill()
        agent.proc.wait(timeout=10)

    receiver = Receiver(port)
    restarted = AgentProcess(node, "--output", url)
    try:
        wait_for(lambda: len(receiver.received) == 2, "the spooled alerts", check=restarted)
        assert restarted.stop() == 0
    finally:
        restarted.kill()
        receiver.stop()
    received += receiver.received
    assert sorted(received) == sorted(a["alert.id"] for a in node.file_alerts())
    assert receiver.bad_signatures == 0
    assert node.spooled() == []


def test_sigterm_with_receiver_down_exits_0_and_keeps_the_spool(node: Node):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    (node.rules / "test.yml").write_text(rule(RULE_A_ID, "cryptominer"))
    node.start_process(6001, "cryptominer", 1)
    agent = AgentProcess(node, "--output", f"http://127.0.0.1:{port}/hook", "--drain-timeout", "1")
    try:
        wait_for(lambda: node.file_alerts(), "the alert", check=agent)
        assert agent.stop() == 0
    finally:
        agent.kill()
    assert node.spooled() == [a["alert.id"] for a in node.file_alerts()]
    assert "1 alert(s) not delivered yet, kept in the spool" in agent.text()


@pytest.mark.skipif(os.geteuid() != 0, reason="fanotify needs root (CAP_SYS_ADMIN)")
def test_file_access_stream_reaches_the_webhook(node: Node):
    model = node.root / "models" / "llama"
    model.mkdir(parents=True)
    (model / "weights.bin").write_bytes(b"w" * 4096)
    node.config.write_text(f"""dedup_window_s: 86400
assets:
  - name: llama
    kind: model
    paths: ["{model}/**"]
    readers: {{users: [svc-train]}}
""")
    (node.rules / "file.yml").write_text(
        rule(RULE_A_ID, "weights.bin", category="file_access", field="file.name")
    )
    receiver = Receiver()
    # A long interval: the alert can only come from the stream, not from a sample.
    agent = AgentProcess(
        node, "--output", receiver.url, "--interval", "3600", sensor="file_access", procfs="/proc"
    )
    try:
        reader = subprocess.run(
            ["cat", str(model / "weights.bin")], capture_output=True, check=True
        )
        assert len(reader.stdout) == 4096
        wait_for(lambda: receiver.received, "the file access alert", check=agent)
        assert agent.stop() == 0
    finally:
        agent.kill()
        receiver.stop()
    (alert,) = node.file_alerts()
    assert receiver.received == [alert["alert.id"]]
    assert alert["process.name"] == "cat"
    assert {e["event.action"] for e in alert["events"]} >= {"open"}
    assert alert["events"][0]["file.path"] == str(model / "weights.bin")


# -- in-process: errors at start, the bounded queue --------------------------------------------


def test_bad_config_and_outputs_exit_2_with_location(node: Node, tmp_path: Path, capsys):
    config = tmp_path / "site.yml"
    config.write_text("agent:\n  interval_s: 10\n  colour: blue\n")
    assert (
        cli.main(
            ["agent", "--config", str(config), "--no-default-rules", "--rules", str(node.rules)]
        )
        == 2
    )
    assert capsys.readouterr().err == (
        f"hpcsec: error: {config}:3: unknown key 'colour' "
        "(expected one of: interval_s, metrics_address, sensor_budget_s)\n"
    )
    (node.rules / "test.yml").write_text(rule(RULE_A_ID, "cryptominer"))
    assert (
        cli.main(
            ["agent", "--no-default-rules", "--rules", str(node.rules), "--output", "gopher://x"]
        )
        == 2
    )
    assert "unknown output type 'gopher://x#" in capsys.readouterr().err
    assert (
        cli.main(
            [
                "agent",
                "--no-default-rules",
                "--rules",
                str(node.rules),
                "--output",
                "http://127.0.0.1:9/h",
                "--webhook-secret-file",
                str(tmp_path / "missing"),
                "--spool",
                str(tmp_path / "spool"),
            ]
        )
        == 2
    )
    assert f"cannot read webhook secret file {tmp_path / 'missing'}" in capsys.readouterr().err
    assert (
        cli.main(["agent", "--no-default-rules", "--rules", str(node.rules), "--sensor", "nosuch"])
        == 2
    )
    assert capsys.readouterr().err == "hpcsec: error: unknown sensor nosuch\n"
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        address = f"127.0.0.1:{taken.getsockname()[1]}"
        assert (
            cli.main(
                [
                    "agent",
                    "--no-default-rules",
                    "--rules",
                    str(node.rules),
                    "--metrics-address",
                    address,
                    "--output",
                    f"file://{tmp_path / 'a.jsonl'}",
                ]
            )
            == 2
        )
    assert capsys.readouterr().err == (
        f"hpcsec: error: cannot serve metrics on {address}: Address already in use\n"
    )
    assert (
        cli.main(
            ["agent", "--no-default-rules", "--rules", str(node.rules), "--metrics-address", "9817"]
        )
        == 2
    )
    assert capsys.readouterr().err == (
        "hpcsec: error: metrics address '9817': expected HOST:PORT, e.g. 127.0.0.1:9817\n"
    )


def test_drops_become_a_status_event_rules_see_and_a_metric(node: Node):
    (node.rules / "drops.yml").write_text(
        rule(RULE_A_ID, "dropped", category="sensor_status", field="event.action")
    )
    out = node.root / "drops.jsonl"
    agent = Agent(
        AgentSettings(
            rule_paths=(str(node.rules),),
            default_rules=False,
            outputs=(f"file://{out}",),
            etc_root=str(node.etc),
            host_name="n1",
        )
    )
    agent.queue = EventQueue(max_events=1)
    ctx = agent._context()
    events = [
        new_event("process", "present", "process", "n1", ctx.timestamp, {"process.pid": i})
        for i in range(4)
    ]
    agent.queue.put(SourceBatch(events, ctx), "process")
    agent._process(agent.queue.get(10, 0))
    assert agent.metrics.drops.labels("process")._value.get() == 3
    agent.sink.drain(0)
    agent._close_outputs()
    alerts = [orjson.loads(line) for line in out.read_bytes().splitlines()]
    assert [
        (a["rule.id"], a["events"][0]["hpcsec.sensor"], a["events"][0]["hpcsec.dropped"])
        for a in alerts
    ] == [(RULE_A_ID, "process", 3)]
    assert alerts[0]["events"][0]["message"] == "3 events dropped: the agent queue was full"


def test_reload_with_a_bad_new_output_keeps_the_old_outputs(node: Node):
    (node.rules / "test.yml").write_text(rule(RULE_A_ID, "cryptominer"))
    first, second = node.root / "first.jsonl", node.root / "second.jsonl"
    node.config.write_text(f"outputs: ['file://{first}']\n")
    agent = Agent(
        AgentSettings(
            config_path=str(node.config),
            rule_paths=(str(node.rules),),
            default_rules=False,
            host_name="n1",
        )
    )
    try:
        missing = node.root / "no-such-secret"
        node.config.write_text(
            f"outputs: ['file://{second}', 'http://127.0.0.1:9/hook']\n"
            f"webhook_secret_file: {missing}\n"
            f"spool: {{dir: {node.spool}}}\n"
        )
        assert agent.reload() is False
        node.config.write_text(f"outputs: ['file://{second}']\n")
        assert agent.reload() is True
        assert agent.sink.outputs.names == [f"file://{second}"]
    finally:
        agent.sink.drain(0)
        agent._close_outputs()
    (failed,) = [orjson.loads(line) for line in first.read_bytes().splitlines()]
    assert failed["rule.id"] == "hpcsec-reload-failed"
    assert failed["host.name"] == "n1"
    assert failed["alert.summary"] == (
        "Reload of rules and config failed, the previous ones keep running: "
        f"cannot read webhook secret file {missing}: No such file or directory"
    )
    assert not second.exists()


def test_dedup_forgets_ended_windows_but_folds_late_matches(node: Node):
    from hpcsec.detector.alerts.dedup import WindowedDedup
    from hpcsec.detector.engine.evaluate import Match
    from hpcsec.detector.engine.loader import load_rules

    (node.rules / "test.yml").write_text(rule(RULE_A_ID, "cryptominer"))
    (loaded,) = load_rules([node.rules]).rules

    def match(epoch: int) -> Match:
        ts = f"2026-11-30T00:00:{epoch:02d}.000Z"
        return Match(
            loaded,
            (
                new_event(
                    "process",
                    "present",
                    "process",
                    "n1",
                    ts,
                    {"process.name": "cryptominer", "user.name": "u1"},
                ),
            ),
        )

    now = [5.0]
    midnight = parse_time("2026-11-30T00:00:00Z").timestamp()
    dedup = WindowedDedup(10, clock=lambda: midnight + now[0])
    (first,) = dedup.add([match(4)])
    assert dedup.add([match(6)]) == []  # same window: folded
    now[0] = 11.0
    assert dedup.rotate() == []  # nothing forgotten yet: the ended window may get late matches
    assert dedup.add([match(9)]) == []  # late: folded into the ended window's alert
    (second,) = dedup.add([match(11)])
    assert second["alert.id"] != first["alert.id"]
    assert first["count"] == 1  # the alert as it was emitted: folding made new values
    now[0] = 21.0
    (forgotten,) = dedup.rotate()
    assert (forgotten["alert.id"], forgotten["count"]) == (first["alert.id"], 3)
    assert [a["alert.id"] for a in dedup.alerts()] == [second["alert.id"]]


def test_the_process_sensor_keeps_what_the_rules_in_force_look_for(node: Node):
    """The agent's sensors get the command-line literals of its rules, those of the new
    rules after a reload: a long command line keeps them (sensors/cmdline_condense.py)."""
    rule_file = node.rules / "cmdline.yml"
    rule_file.write_text(rule(RULE_A_ID, "first-literal", field="process.command_line"))
    agent = Agent(AgentSettings(rule_paths=(str(node.rules),), default_rules=False, host_name="n1"))
    try:
        literals = agent._context().cmdline_literals
        assert literals is not None and literals.found(b"run --first-literal")
        rule_file.write_text(rule(RULE_A_ID, "second-literal", field="process.command_line"))
        assert agent.reload() is True
        literals = agent._context().cmdline_literals
        assert literals is not None and literals.found(b"second-literal")
        assert not literals.found(b"first-literal")
    finally:
        agent.sink.drain(0)
        agent._close_outputs()

"""A reload whose new config names an output URL with tokens (a mistyped scheme, so it
fails): the `hpcsec-reload-failed` alert sent to every output and the agent's log show only
the redacted URL."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from hpcsec.detector.outputs.protocol import redact
from tests.detector.runtime.agent_harness import (
    RULE_A_ID,
    AgentProcess,
    Node,
    rule,
    wait_for,
)

PATH_TOKEN = "T000/B000/XXXXpathTOKEN"
QUERY_TOKEN = "QUERYsecret"


@pytest.fixture
def node(tmp_path: Path) -> Node:
    return Node(tmp_path)


@pytest.mark.parametrize(
    "url",
    [
        f"htps://hooks.example/services/{PATH_TOKEN}?token={QUERY_TOKEN}",
        f"https://user:PASSWORDx@hooks.example:99999/services/{PATH_TOKEN}?token={QUERY_TOKEN}",
        f"syslog+tcp://user:PASSWORDx@siem:514?facility=nope&token={QUERY_TOKEN}",
    ],
    ids=["mistyped-scheme", "bad-port", "syslog-option"],
)
def test_reload_failed_alert_and_log_show_only_the_redacted_url(node: Node, url: str):
    (node.rules / "test.yml").write_text(rule(RULE_A_ID, "cryptominer"))
    node.config.write_text(f"dedup_window_s: 86400\noutputs: ['file://{node.alerts_file}']\n")
    agent = AgentProcess(node, file_output=False)
    try:
        node.config.write_text(
            f"dedup_window_s: 86400\noutputs: ['file://{node.alerts_file}', '{url}']\n"
        )
        agent.signal(signal.SIGHUP)
        (failed,) = wait_for(
            lambda: [a for a in node.file_alerts() if a["rule.id"] == "hpcsec-reload-failed"],
            "the reload-failed alert",
            check=agent,
        )
        wait_for(lambda: "reload failed" in agent.text(), "the log line", check=agent)
    finally:
        agent.stop()
    alert_text = node.alerts_file.read_text()
    assert redact(url) in failed["alert.summary"]
    assert redact(url) in agent.text()
    for secret in (PATH_TOKEN, QUERY_TOKEN, "services", "PASSWORDx"):
        assert secret not in alert_text
        assert secret not in agent.text()

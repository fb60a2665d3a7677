"""Webhook URLs carry tokens (Slack-style paths, query strings): no report, log, metrics label,
spool directory or error message shows more than scheme, host, port and a short hash; a
signing secret others can read is warned about, and refused by the agent."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hpcsec.detector.cli import main as cli
from hpcsec.detector.core.display import redacted_url
from tests.ports import refusing_port
from tests.rule_texts import MINER_RULE

PATH_TOKEN = "T000/B000/XXXXpathTOKEN"
QUERY_TOKEN = "QUERYsecret"


def test_redacted_url_keeps_scheme_host_port_and_a_hash():
    url = f"https://user:pw@hooks.example/services/{PATH_TOKEN}?token={QUERY_TOKEN}#frag"
    shown = redacted_url(url)
    assert shown.startswith("https://hooks.example:443#") and len(shown.split("#")[1]) == 6
    for secret in (PATH_TOKEN, QUERY_TOKEN, "services", "user", "pw", "frag"):
        assert secret not in shown
    other = redacted_url(f"https://hooks.example/services/other?token={QUERY_TOKEN}")
    assert other != shown and other.split("#")[0] == shown.split("#")[0]
    assert (
        redacted_url("http://[::1]:8080/x")
        == "http://[::1]:8080#" + redacted_url("http://[::1]:8080/x").split("#")[1]
    )
    for mistyped in (
        f"htps://hooks.example/{PATH_TOKEN}",
        f"hooks.example/{PATH_TOKEN}?{QUERY_TOKEN}",
    ):
        assert PATH_TOKEN not in redacted_url(mistyped)
    assert "\x1b" not in redacted_url("http://ho\x1bst/x")


@pytest.fixture
def events(tmp_path: Path) -> tuple[Path, Path]:
    rules = tmp_path / "gpu_hijack.yml"
    rules.write_text(MINER_RULE)
    events = tmp_path / "events.jsonl"
    event = {
        "@timestamp": "2026-11-30T01:00:00Z",
        "event.id": "e1",
        "event.category": "process",
        "event.action": "sample",
        "host.name": "n1",
        "hpcsec.sensor": "t",
        "process.name": "xmrig",
        "process.pid": 1,
        "user.name": "mallory",
    }
    events.write_text(json.dumps(event) + "\n")
    return rules, events


def private_secret(tmp_path: Path, mode: int = 0o600) -> Path:
    secret = tmp_path / "webhook.secret"
    secret.write_bytes(b"s3cret")
    secret.chmod(mode)
    return secret


def everything_under(root: Path) -> str:
    """Every name and every file's text under root."""
    parts = []
    for path in root.rglob("*"):
        parts.append(str(path.relative_to(root)))
        if path.is_file():
            parts.append(path.read_bytes().decode("utf-8", "replace"))
    return "\n".join(parts)


def test_scan_to_an_unreachable_webhook_shows_no_token(events, tmp_path, capsys):
    rules, events_file = events
    url = f"http://127.0.0.1:{refusing_port()}/services/{PATH_TOKEN}?token={QUERY_TOKEN}"
    spool = tmp_path / "spool"
    argv = ["scan", "--events", str(events_file), "--no-default-rules", "--rules", str(rules)]
    argv += ["--output", url]
    argv += ["--webhook-secret-file", str(private_secret(tmp_path)), "--spool", str(spool)]
    assert cli.main(argv) == 1
    err = capsys.readouterr().err
    assert f"{redacted_url(url)}: 1 alert(s) not delivered yet, kept in the spool" in err
    for secret in (PATH_TOKEN, QUERY_TOKEN, "services"):
        assert secret not in err
        assert secret not in everything_under(spool)  # directory names and destination files
    assert redacted_url(url) in (spool / next(spool.iterdir()).name / "destination").read_text()


@pytest.mark.parametrize("where", ["command line", "config"])
def test_a_mistyped_scheme_shows_no_token(events, tmp_path, capsys, where):
    rules, events_file = events
    url = f"htps://hooks.example/services/{PATH_TOKEN}?token={QUERY_TOKEN}"
    if where == "config":
        config = tmp_path / "site.yml"
        config.write_text(f"outputs: ['{url}']\n")
        assert cli.main(["config", "check", str(config)]) == 2
        argv = [
            "scan",
            "--events",
            str(events_file),
            "--rules",
            str(rules),
            "--config",
            str(config),
        ]
    else:
        argv = ["scan", "--events", str(events_file), "--no-default-rules", "--rules", str(rules)]
    argv += ["--output", url]
    assert cli.main(argv) == 2
    captured = capsys.readouterr()
    text = captured.out + captured.err
    assert "htps://hooks.example#" in text
    for secret in (PATH_TOKEN, QUERY_TOKEN, "services"):
        assert secret not in text


def test_a_secret_file_others_can_read_is_a_warning_for_scan(events, tmp_path, capsys):
    rules, events_file = events
    url = f"http://127.0.0.1:{refusing_port()}/hook"
    secret = private_secret(tmp_path, 0o644)
    argv = ["scan", "--events", str(events_file), "--no-default-rules", "--rules", str(rules)]
    argv += ["--output", url]
    argv += ["--webhook-secret-file", str(secret), "--spool", str(tmp_path / "spool")]
    assert cli.main(argv) == 1  # the scan still runs and reports its alert
    assert "readable by group or others (mode 0644)" in capsys.readouterr().err


@pytest.mark.parametrize("mode", [0o640, 0o604])
def test_the_agent_refuses_a_secret_file_others_can_read(events, tmp_path, capsys, mode):
    rules, _ = events
    secret = private_secret(tmp_path, mode)
    argv = ["agent", "--rules", str(rules), "--output", "http://127.0.0.1:9/hook"]
    argv += ["--webhook-secret-file", str(secret), "--spool", str(tmp_path / "spool")]
    assert cli.main(argv) == 2
    assert (
        f"is readable by group or others (mode {mode:04o}); chmod 600 it" in capsys.readouterr().err
    )

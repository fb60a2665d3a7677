"""File (JSONL) and stdout outputs, and the URL registry's errors."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess

import pytest

from hpcsec.detector.core.errors import HpcsecError
from hpcsec.detector.outputs.protocol import OutputError, redact
from hpcsec.detector.outputs.registry import open_outputs
from tests.hostile_fs import as_root, as_user, mode, umask
from tests.rule_texts import MINER_RULE

ALERTS = [
    {"alert.id": "a1", "rule.id": "r", "alert.summary": "two\nlines"},
    {"alert.id": "a2", "rule.id": "r", "user.name": "zoë"},
]


def test_jsonl_file_appends_one_alert_per_line(tmp_path):
    path = tmp_path / "alerts.jsonl"
    with open_outputs([f"file://{path}"]) as outputs:
        report = outputs.deliver(ALERTS[:1])
        assert outputs.spool_dir is None  # local outputs are written directly, no spool
    assert report.destinations[f"file://{path}"].delivered == 1
    with open_outputs([f"file://{path}"]) as outputs:
        outputs.deliver(ALERTS[1:])
    lines = path.read_text(encoding="utf-8").splitlines()
    assert [json.loads(line) for line in lines] == ALERTS


def test_stdout_writes_json_lines(capsys):
    with open_outputs(["-"]) as outputs:
        report = outputs.deliver(ALERTS)
    assert report.complete
    out = capsys.readouterr().out.splitlines()
    assert [json.loads(line) for line in out] == ALERTS


def test_unwritable_jsonl_file_is_a_clear_error(tmp_path):
    with pytest.raises(OutputError, match=r"cannot open for appending: No such file"):
        open_outputs([f"file://{tmp_path}/missing/alerts.jsonl"])
    (tmp_path / "dir.jsonl").mkdir()
    with pytest.raises(OutputError, match=r"cannot open for appending: Is a directory"):
        open_outputs([f"file://{tmp_path}/dir.jsonl"])


def test_opening_a_file_output_creates_nothing_until_the_first_alert(tmp_path):
    path = tmp_path / "alerts.jsonl"
    with open_outputs([f"file://{path}"]) as outputs:
        assert not path.exists()  # a config that fails after this leaves no stray file
        outputs.deliver([])
        assert not path.exists()
        outputs.deliver(ALERTS[:1])
        assert json.loads(path.read_text()) == ALERTS[0]


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("ftp://host/x", "unknown output type 'ftp://host#"),  # the path is not shown
        ("alerts.jsonl", "unknown output type '?://#"),  # a mistyped URL shows no path
        ("file://relative/alerts.jsonl", "a file output is file:///ABSOLUTE/PATH.jsonl"),
        ("file:///tmp/alerts.txt", "a file output must end in .jsonl"),
        ("syslog+tcp://:514", "expected syslog+tcp://HOST:PORT"),
        ("syslog+udp://host:port", "bad port"),
        ("syslog+udp://host:514?ca=x", "ca/cert/key only apply to syslog+tls"),
        ("syslog+tcp://host:514?fmt=cef", "unknown option(s) fmt"),
        ("syslog+tcp://host:514?format=xml", "format must be json or cef"),
        ("syslog+tcp://host:514?facility=mail2", "unknown facility 'mail2'"),
        ("syslog+tls://host:6514?ca=/nonexistent/ca.pem", "TLS files"),
        ("https://siem.example/hook", "needs a signing secret: --webhook-secret-file FILE"),
        ("http://:80/x", "expected http(s)://HOST[:PORT]/PATH"),
        ("", "empty output URL"),
    ],
)
def test_malformed_output_urls(url, message):
    with pytest.raises(OutputError) as info:
        open_outputs([url])
    assert message in str(info.value)
    assert isinstance(info.value, HpcsecError)  # the CLI prints it and exits 2


def test_same_output_twice_is_an_error(tmp_path):
    with pytest.raises(OutputError, match="is given twice"):
        open_outputs([f"file://{tmp_path}/a.jsonl", f"file://{tmp_path}/a.jsonl"])


def test_webhook_secret_file_problems(tmp_path):
    empty = tmp_path / "empty"
    empty.write_text("\n")
    with pytest.raises(OutputError, match=rf"webhook secret file {empty} is empty"):
        open_outputs(["https://siem.example/hook"], secret_file=str(empty))
    with pytest.raises(
        OutputError,
        match=rf"cannot read webhook secret file "
        rf"{tmp_path}/nope: No such file or directory",
    ):
        open_outputs(["https://siem.example/hook"], secret_file=str(tmp_path / "nope"))


def test_outputs_come_from_the_config_when_none_are_given(tmp_path):
    from hpcsec.detector.config.site import SiteConfig

    config = SiteConfig(outputs=(f"file://{tmp_path}/c.jsonl",))
    with open_outputs([], config=config) as outputs:
        assert outputs.names == [f"file://{tmp_path}/c.jsonl"]
    with open_outputs(["-"], config=config) as outputs:  # the command line wins
        assert outputs.names == ["-"]


def test_bytes_that_are_not_utf8_reach_the_file_escaped(tmp_path):
    path = tmp_path / "alerts.jsonl"
    with open_outputs([f"file://{path}"]) as outputs:
        report = outputs.deliver([{"alert.id": "a1", "file.path": "/x/\udce9t\udcc3.bin"}])
    assert report.complete
    assert json.loads(path.read_text(encoding="utf-8")) == {
        "alert.id": "a1",
        "file.path": "/x/\\xe9t\\xc3.bin",
    }


RULE = MINER_RULE


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--output", "kafka://broker:9092"], "unknown output type 'kafka://broker:9092#"),
        (
            [
                "--output",
                "https://siem.example/hook",
                "--webhook-secret-file",
                "/nonexistent/secret",
            ],
            "cannot read webhook secret file /nonexistent/secret: No such file or directory",
        ),
        (
            ["--output", "syslog+tcp://siem:tcp"],
            f"output {redact('syslog+tcp://siem:tcp')}: bad port",
        ),
        (["--config", "{config}"], "{config}:1: output 'syslog://siem:514#"),
    ],
)
def test_scan_with_a_malformed_output_exits_2_with_the_reason(tmp_path, capsys, args, message):
    from hpcsec.detector.cli.main import main

    rules = tmp_path / "rules.yml"
    rules.write_text(RULE)
    events = tmp_path / "events.jsonl"
    events.write_text(
        json.dumps(
            {
                "@timestamp": "2026-11-30T01:00:00Z",
                "host.name": "n1",
                "event.category": "process",
                "process.name": "xmrig",
            }
        )
        + "\n"
    )
    config = tmp_path / "site.yml"
    config.write_text("outputs: ['syslog://siem:514']\n")
    args = [a.replace("{config}", str(config)) for a in args]
    rc = main(
        [
            "scan",
            "--events",
            str(events),
            "--no-default-rules",
            "--rules",
            str(rules),
            "--spool",
            str(tmp_path / "spool"),
            *args,
        ]
    )
    err = capsys.readouterr().err
    assert rc == 2
    assert f"hpcsec: error: {message.replace('{config}', str(config))}" in err
    assert "Traceback" not in err


@pytest.fixture
def full_disk(tmp_path):
    """A tiny tmpfs, filled up: every write to a file there fails with ENOSPC."""
    disk = tmp_path / "disk"
    disk.mkdir()
    mount = ["mount", "-t", "tmpfs", "-o", "size=64k", "hpcsec-test", str(disk)]
    if subprocess.run(mount, capture_output=True).returncode:
        pytest.skip("cannot mount a tmpfs here")
    try:
        fd = os.open(disk / "filler", os.O_WRONLY | os.O_CREAT, 0o600)
        with contextlib.suppress(OSError):
            while True:
                os.write(fd, b"x" * 4096)
        os.close(fd)
        yield disk
    finally:
        subprocess.run(["umount", str(disk)], check=True)


def test_a_file_output_that_cannot_write_reports_each_alert(full_disk):
    url = f"file://{full_disk / 'full.jsonl'}"
    with open_outputs([url]) as outputs:
        report = outputs.deliver(ALERTS)
    d = report.destinations[url]
    assert (d.delivered, d.failed) == (0, 2)
    assert [(o.alert_id, o.state) for o in report.outcomes] == [("a1", "failed"), ("a2", "failed")]
    assert report.problems() == [
        f"{url}: 2 alert(s) failed and will not be retried ({url}: No space left on device)"
    ]


def test_a_batch_goes_to_the_file_whole(tmp_path):
    path = tmp_path / "alerts.jsonl"
    batch = [{"alert.id": f"b{i}", "rule.id": "r"} for i in range(500)]
    with open_outputs([f"file://{path}"]) as outputs:
        assert outputs.deliver(batch).destinations[f"file://{path}"].delivered == 500
    assert [json.loads(line)["alert.id"] for line in path.read_text().splitlines()] == [
        f"b{i}" for i in range(500)
    ]


@as_root
def test_a_file_output_never_writes_through_a_planted_symlink(shared, victim):
    """alice links the alerts file to root's file: the output is refused, the file intact."""
    as_user("alice", "ln", "-s", str(victim), str(shared / "alerts.jsonl"))
    url = f"file://{shared / 'alerts.jsonl'}"
    with pytest.raises(OutputError, match="cannot open"):
        open_outputs([url])
    assert victim.read_text() == "root's file\n"


@as_root
def test_a_file_output_planted_by_another_user_is_refused(shared):
    as_user("alice", "touch", str(shared / "alerts.jsonl"))
    with pytest.raises(OutputError, match="belongs to alice"):
        open_outputs([f"file://{shared / 'alerts.jsonl'}"])


def test_a_file_output_is_created_0600_whatever_the_umask(tmp_path):
    path = tmp_path / "alerts.jsonl"
    with umask(0o022), open_outputs([f"file://{path}"]) as outputs:
        outputs.deliver(ALERTS)
    assert mode(path) == 0o600

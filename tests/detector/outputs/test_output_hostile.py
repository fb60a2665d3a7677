"""Hostile alert contents through the network outputs, to a real rsyslogd and a real HTTP
receiver: no forged records, no raw control bytes, no alert lost or shredded for its size."""

from __future__ import annotations

import json
import uuid

import pytest

from hpcsec.detector.outputs.fit import fit
from hpcsec.detector.outputs.registry import open_outputs
from hpcsec.detector.outputs.rfc5424 import format_message
from hpcsec.detector.outputs.webhook import MAX_BODY_BYTES
from tests.detector.outputs.sample_alerts import make_alert
from tests.detector.outputs.test_output_syslog import RSYSLOGD, Rsyslog, complete_lines
from tests.detector.outputs.test_output_webhook import Receiver

FORGED = "\n<13>1 2026-11-30T01:02:03Z gpu-017 forged - - - forged record\r\n"
CONTROLS = "\x00\x1b[2J\x1b]0;t\x07\x7f\x9b\u202e\u200b\ufeff"


def hostile_alert(marker: str, n: int, **fields) -> dict:
    return make_alert(
        marker,
        n,
        **{
            "user.name": f"mallory{CONTROLS}{FORGED}",
            "process.name": f"x{FORGED}",
            "process.command_line": f"python3 train.py {FORGED}{CONTROLS}",
            "alert.summary": f"{marker} summary{FORGED}{CONTROLS}",
            "rule.title": f"title|{FORGED}",
            **fields,
        },
    )


RAW_CONTROLS = [chr(c) for c in (*range(0x20), 0x7F, *range(0x80, 0xA0))] + [
    "\u202e",
    "\u200b",
]


@pytest.fixture(scope="module")
def rsyslog(tmp_path_factory):
    if RSYSLOGD is None:
        pytest.skip("rsyslogd not installed (Debian package rsyslog; `make system-deps`)")
    server = Rsyslog(tmp_path_factory.mktemp("rsyslog"))
    yield server
    server.stop()


@pytest.fixture(scope="module")
def default_rsyslog(tmp_path_factory):
    """rsyslogd with its default 8 KiB message size, the limit most receivers run with."""
    if RSYSLOGD is None:
        pytest.skip("rsyslogd not installed (Debian package rsyslog; `make system-deps`)")
    server = Rsyslog(tmp_path_factory.mktemp("rsyslog-default"), max_message_size="8k")
    yield server
    server.stop()


@pytest.mark.rsyslog
@pytest.mark.parametrize(
    ("kind", "body"), [(k, b) for k in ("udp", "tcp") for b in ("json", "cef")]
)
def test_a_forged_header_in_node_text_makes_no_second_record(rsyslog, tmp_path, kind, body):
    marker = uuid.uuid4().hex
    port = rsyslog.udp if kind == "udp" else rsyslog.tcp
    url = f"syslog+{kind}://127.0.0.1:{port}?format={body}"
    alerts = [hostile_alert(marker, i) for i in range(2)] + [make_alert(marker, 2)]
    with open_outputs([url], spool_dir=str(tmp_path)) as outputs:
        assert outputs.deliver(alerts).complete
    got = rsyslog.records(marker, 3)
    assert len(got) == 3
    assert not any("forged" in r["app"] or r["msg"].startswith("forged") for r in got)
    every = [json.loads(line) for line in complete_lines(rsyslog.out)]
    assert not [r for r in every if r["app"] == "forged" or r["msg"].startswith("forged")]
    for record in got:
        # rsyslog here keeps control characters as received: none were sent
        raw = record["raw"]
        assert not [c for c in RAW_CONTROLS if c in raw], repr(raw)
        if body == "json":
            sent = json.loads(record["msg"])
            assert sent["alert.id"].startswith(marker)
    if body == "json":
        by_id = {json.loads(r["msg"])["alert.id"]: json.loads(r["msg"]) for r in got}
        assert by_id[f"{marker}-0"]["process.command_line"] == alerts[0]["process.command_line"]
    else:
        cef = next(r["msg"] for r in got if f"{marker}-0" in r["msg"])
        assert "\\\\x1b[2J\\\\x1b]0;t\\\\x07\\\\x7f\\\\x9b\\\\u202e" in cef
        assert "|title\\| <13>1 2026-11-30T01:02:03Z gpu-017 forged" in cef


def test_header_fields_are_printable_ascii_and_sd_values_escaped():
    alert = hostile_alert("m", 0, **{"rule.id": "r\x1b id"})
    message = format_message(alert, hostname="gpu\u202e-1\n", procid=7)
    head = message.split(b" [", 1)[0].decode("ascii")
    assert head.endswith(" - hpcsec 7 -")  # hostname and msgid not PRINTUSASCII: nil values
    sd = message.split(b" [", 1)[1].split(b"] {", 1)[0].decode("ascii")
    assert "\\\\x1b[2J" in sd and "\\\\u202e" in sd
    assert not [c for c in RAW_CONTROLS if c in message.decode("utf-8")]


@pytest.mark.rsyslog
@pytest.mark.parametrize("kind", ["udp", "tcp"])
def test_a_64k_command_line_arrives_cut_and_the_next_alerts_whole(default_rsyslog, tmp_path, kind):
    marker = uuid.uuid4().hex
    port = default_rsyslog.udp if kind == "udp" else default_rsyslog.tcp
    url = f"syslog+{kind}://127.0.0.1:{port}"
    huge = make_alert(
        marker,
        0,
        **{"process.command_line": "\x1b" * 65_536, "process.args": ["a" * 65_536, "--x"]},
    )
    alerts = [huge, make_alert(marker, 1), make_alert(marker, 2)]
    with open_outputs([url], spool_dir=str(tmp_path)) as outputs:
        report = outputs.deliver(alerts)
    assert report.destinations[url].delivered == 3
    got = {json.loads(r["msg"])["alert.id"]: r for r in default_rsyslog.records(marker, 3)}
    assert sorted(got) == [f"{marker}-{i}" for i in range(3)]
    for i in (1, 2):
        assert json.loads(got[f"{marker}-{i}"]["msg"]) == alerts[i]  # the framing held
    cut = json.loads(got[f"{marker}-0"]["msg"])
    assert len(got[f"{marker}-0"]["raw"].encode()) <= 8192
    assert cut["alert.truncated"] is True
    assert cut["alert.original_size"] > 6 * 65_536  # \x1b is 6 bytes as a JSON escape
    assert "events" not in cut and cut["hpcsec.events_omitted"] == 1
    assert cut["process.command_line"].startswith("\x1b" * 100)
    assert cut["process.command_line"].endswith(
        "->" + str(cut["process.command_line"].count("\x1b")) + "]"
    )
    assert "...[cut 65536->" in cut["process.command_line"]
    assert cut["alert.id"] == f"{marker}-0" and cut["rule.title"] == huge["rule.title"]


def test_cutting_is_deterministic_longest_first_and_shorter_values_stay():
    alert = {"a": "x" * 5000, "b": "y" * 3000, "c": "short", "n": 7}

    def encode(a):
        return json.dumps(a, sort_keys=True).encode()

    one, two = fit(alert, encode, 2000), fit(dict(reversed(alert.items())), encode, 2000)
    assert json.loads(one) == json.loads(two)
    got = json.loads(one)
    assert len(one) <= 2000
    assert got["c"] == "short" and got["n"] == 7
    keep = got["a"].index(".")
    assert got["a"] == "x" * keep + f"...[cut 5000->{keep}]"
    assert got["b"] == "y" * keep + f"...[cut 3000->{keep}]"  # both cut to one length


def test_nothing_but_identity_when_even_that_is_all_that_fits():
    alert = {"alert.id": "a1", "rule.title": "t", "findings": [{"x": "y" * 50}] * 200}
    body = json.loads(fit(alert, lambda a: json.dumps(a).encode(), 600))
    assert body["alert.id"] == "a1" and body["alert.truncated"] is True
    assert isinstance(body["findings"], str) and "...[cut " in body["findings"]


def test_a_huge_alert_reaches_a_webhook_cut_to_its_limit(tmp_path):
    receiver = Receiver().start()
    secret = tmp_path / "secret"
    secret.write_bytes(b"s3cret-shared-with-the-receiver")
    secret.chmod(0o600)
    try:
        huge = make_alert("w", 0, **{"process.command_line": "\x00" * (512 * 1024)})
        with open_outputs(
            [receiver.url], secret_file=str(secret), spool_dir=str(tmp_path / "spool")
        ) as outputs:
            report = outputs.deliver([huge, make_alert("w", 1)])
        assert report.complete
        assert len(receiver.bodies) == 2
        assert len(receiver.bodies[0]) <= MAX_BODY_BYTES
        cut = json.loads(receiver.bodies[0])
        assert cut["alert.truncated"] is True and "...[cut 524288->" in cut["process.command_line"]
        assert json.loads(receiver.bodies[1]) == make_alert("w", 1)
    finally:
        receiver.stop()


def test_max_bytes_below_what_an_alert_needs_is_a_config_error(tmp_path):
    from hpcsec.detector.outputs.protocol import OutputError

    with pytest.raises(OutputError, match="max_bytes must be at least 2048"):
        open_outputs(["syslog+udp://127.0.0.1:514?max_bytes=100"], spool_dir=str(tmp_path))

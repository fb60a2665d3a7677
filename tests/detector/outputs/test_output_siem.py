"""Splunk HEC and Elasticsearch bulk outputs, and webhooks with their own credential header,
against local receivers that answer as the real endpoints do (siem_receivers.py)."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest

from hpcsec.detector.config.site import load_config
from hpcsec.detector.outputs.protocol import OutputError, redact
from hpcsec.detector.outputs.registry import open_outputs
from tests.detector.outputs.siem_receivers import BulkReceiver, HecReceiver

TOKEN = "11111111-2222-3333-4444-555555555555"
API_KEY = "VnVhQ2ZHY0JDZGJrUW0tZTVhT3g6dWkybHAyYXhUTm1zeWFrdzl0dk5udw=="


def alert(n: int) -> dict:
    return {
        "alert.id": f"a{n:03d}",
        "@timestamp": "2026-11-30T01:00:00.000Z",
        "rule.id": "r-theft",
        "rule.title": "Model weights read by a copy tool",
        "rule.level": "high",
        "rule.vector": "model_theft",
        "rule.tags": ["attack.t1005"],
        "host.name": "gpu-017",
        "user.name": "eve\x1b[31m",
        "user.is_admin": False,
        "process.name": "rclone",
        "alert.summary": f"alert {n}",
    }


def private(tmp_path, name: str, content: str, mode: int = 0o600) -> str:
    path = tmp_path / name
    path.write_text(content + "\n")
    path.chmod(mode)
    return str(path)


@pytest.fixture
def hec():
    r = HecReceiver(TOKEN, acks=True, pending_polls=1)
    yield r
    r.stop()


@pytest.fixture
def bulk():
    r = BulkReceiver(API_KEY)
    yield r
    r.stop()


def hec_url(r: HecReceiver, token_file: str) -> str:
    return f"splunk+http://127.0.0.1:{r.port}?token_file={token_file}"


def test_hec_event_envelope_token_channel_and_ack(hec, tmp_path):
    url = hec_url(hec, private(tmp_path, "hec.token", TOKEN))
    with open_outputs([url], spool_dir=str(tmp_path / "spool")) as outputs:
        report = outputs.deliver([alert(1)], timeout_s=30)
    assert report.complete and report.destinations[redact(url)].delivered == 1
    (envelope,) = hec.events
    assert envelope["source"] == "hpcsec" and envelope["sourcetype"] == "hpcsec:alert"
    assert envelope["host"] == "gpu-017"
    assert envelope["time"] == datetime(2026, 11, 30, 1, tzinfo=UTC).timestamp()
    assert envelope["event"]["alert.id"] == "a001"
    assert envelope["event"]["user.name"] == "eve\x1b[31m"  # JSON-escaped on the wire
    assert b"\x1b" not in hec.requests[0][2]
    assert hec.ack_polls == 2  # not yet indexed, then indexed: delivered only after that


def test_hec_invalid_token_is_permanent(hec, tmp_path):
    url = hec_url(hec, private(tmp_path, "hec.token", "wrong-token"))
    with open_outputs([url], spool_dir=str(tmp_path / "spool")) as outputs:
        report = outputs.deliver([alert(1)], timeout_s=5)
    d = report.destinations[redact(url)]
    assert (d.delivered, d.pending, d.failed) == (0, 0, 1)
    assert "HTTP 403" in d.last_error and hec.events == []


def test_hec_server_busy_is_retried_after_retry_after(hec, tmp_path):
    hec.busy = 1
    url = hec_url(hec, private(tmp_path, "hec.token", TOKEN))
    with open_outputs([url], spool_dir=str(tmp_path / "spool")) as outputs:
        report = outputs.deliver([alert(1)], timeout_s=30)
    assert report.complete
    assert [e["event"]["alert.id"] for e in hec.events] == ["a001"]
    busy_at = hec.requests[0][3]
    accepted_at = next(t for p, _, _, t in hec.requests[1:] if p.endswith("/event"))
    assert accepted_at - busy_at >= 1.0


def test_hec_token_readable_by_others_is_refused_for_the_agent(hec, tmp_path):
    url = hec_url(hec, private(tmp_path, "hec.token", TOKEN, 0o640))
    with pytest.raises(OutputError, match="readable by group or others"):
        open_outputs([url], spool_dir=str(tmp_path / "spool"), private_secret=True)


def es_url(r: BulkReceiver, index: str = "hpcsec-alerts") -> str:
    return f"elasticsearch+http://127.0.0.1:{r.port}/{index}"


def es_config(tmp_path, url: str, key: str = API_KEY):
    config = tmp_path / "site.yml"
    key_file = private(tmp_path, "es.key", key)
    config.write_text(f"outputs:\n  - url: {url}\n    token_file: {key_file}\n")
    return load_config(config)


def test_bulk_create_with_alert_id_is_idempotent_and_ecs(bulk, tmp_path):
    config = es_config(tmp_path, es_url(bulk))
    for _ in range(2):  # the same alert twice: the second is answered 409, and is delivered
        with open_outputs([], config=config, spool_dir=str(tmp_path / "spool")) as outputs:
            assert outputs.deliver([alert(1)], timeout_s=10).complete
    statuses = [json.loads(r[2].splitlines()[0]) for r in bulk.requests]
    assert statuses == [{"create": {"_id": "a001"}}] * 2
    doc = bulk.docs["hpcsec-alerts"]["a001"]
    assert doc["event.kind"] == "alert" and doc["event.severity"] == 73
    assert doc["rule.name"] == "Model weights read by a copy tool"
    assert doc["rule.ruleset"] == "model_theft" and doc["tags"] == ["attack.t1005"]
    assert doc["message"] == "alert 1" and doc["process.name"] == "rclone"
    assert doc["hpcsec.user.is_admin"] is False and "user.is_admin" not in doc


def test_bulk_item_429_is_retried_and_400_is_permanent(bulk, tmp_path):
    bulk.item_statuses = [429, 400]
    config = es_config(tmp_path, es_url(bulk))
    with open_outputs([], config=config, spool_dir=str(tmp_path / "spool")) as outputs:
        report = outputs.deliver([alert(1), alert(2)], timeout_s=30)
    d = report.destinations[redact(es_url(bulk))]
    assert (d.delivered, d.pending, d.failed) == (1, 0, 1)
    assert "mapper_parsing_exception" in d.last_error
    assert list(bulk.docs["hpcsec-alerts"]) in (["a001"], ["a002"])


def test_bulk_request_429_waits_for_retry_after(bulk, tmp_path):
    bulk.request_statuses = [(429, {"Retry-After": "1"})]
    config = es_config(tmp_path, es_url(bulk))
    with open_outputs([], config=config, spool_dir=str(tmp_path / "spool")) as outputs:
        assert outputs.deliver([alert(1)], timeout_s=30).complete
    assert bulk.requests[1][3] - bulk.requests[0][3] >= 1.0
    assert list(bulk.docs["hpcsec-alerts"]) == ["a001"]


def test_bulk_wrong_api_key_stays_spooled(bulk, tmp_path):
    config = es_config(tmp_path, es_url(bulk), key="bm90LXRoZS1rZXk=")
    with open_outputs([], config=config, spool_dir=str(tmp_path / "spool")) as outputs:
        report = outputs.deliver([alert(1)], timeout_s=0)
    assert report.destinations[redact(es_url(bulk))].pending == 1


class HeaderReceiver(HecReceiver):
    """A plain webhook endpoint that wants its own Authorization header, no HMAC."""

    def handle(self, path, headers, body):
        if headers.get("Authorization") != f"Bearer {self.token}":
            return 401, {}, {}
        self.events.append(json.loads(body))
        return 202, {}, {}


def test_webhook_with_header_from_file_and_no_signature(tmp_path):
    receiver = HeaderReceiver(TOKEN)
    try:
        auth = private(tmp_path, "auth", f"Bearer {TOKEN}")
        config = tmp_path / "site.yml"
        url = f"http://127.0.0.1:{receiver.port}/dcr"
        config.write_text(
            f"outputs:\n  - url: {url}\n    sign: false\n"
            f"    headers:\n      Authorization: {{file: {auth}}}\n      X-Source: hpcsec\n"
        )
        site = load_config(config)
        with open_outputs([], config=site, spool_dir=str(tmp_path / "spool")) as outputs:
            assert outputs.deliver([alert(1)], timeout_s=10).complete
        (_, headers, _, _) = receiver.requests[0]
        assert headers["X-Source"] == "hpcsec" and headers["Idempotency-Key"] == "a001"
        assert "X-Hpcsec-Signature" not in headers
        assert [e["alert.id"] for e in receiver.events] == ["a001"]
    finally:
        receiver.stop()


def test_webhook_without_secret_or_credential_still_needs_a_secret(tmp_path):
    with pytest.raises(OutputError, match="needs a signing secret"):
        open_outputs(["https://example.invalid/x"], spool_dir=str(tmp_path))


def test_header_with_a_line_break_is_refused(tmp_path):
    config = tmp_path / "site.yml"
    config.write_text(
        'outputs:\n  - url: https://example.invalid/x\n    headers: {X-A: "a\\r\\nX-B: b"}\n'
    )
    with pytest.raises(OutputError, match="line break"):
        open_outputs([], config=load_config(config), spool_dir=str(tmp_path))

"""A node's `Nats-Msg-Id`s are keyed by a secret of its own (msgid.py): another node that can
predict an event body cannot publish its id first and have JetStream drop the real event as a
duplicate, while the same node's retries are still stored once. Against a real nats-server
for what JetStream does with the ids; the key file's rules on their own."""

from __future__ import annotations

import asyncio
import hashlib
import os
from pathlib import Path

import orjson
import pytest

from hpcsec.detector.cli.main import main
from hpcsec.detector.cluster import msgid
from hpcsec.detector.cluster.agent_tap import NatsTap
from hpcsec.detector.cluster.forwarder import EventForwarder
from hpcsec.detector.cluster.msgid import MESSAGE_KEY, MessageKeyError, message_id, message_key
from hpcsec.detector.cluster.streams import EVENTS_STREAM, connect
from tests.cluster.conftest import wait_for
from tests.cluster.harness import NatsServer
from tests.cluster.scenario import node_files

# a periodic sample another node can predict: the same body whoever publishes it
SAMPLE = {
    "@timestamp": "2026-12-01T02:00:00Z",
    "event.kind": "state",
    "event.category": "sensor_status",
    "event.action": "ok",
    "host.name": "gpu-101",
    "hpcsec.sensor": "firmware",
}


async def _stored(url: str) -> list[tuple[str, bytes]]:
    """(Nats-Msg-Id, body) of every message of the events stream."""
    nc = await connect([url], reconnect=False)
    try:
        js = nc.jetstream()
        last = (await js.stream_info(EVENTS_STREAM)).state.last_seq
        messages = [await js.get_msg(EVENTS_STREAM, seq) for seq in range(1, last + 1)]
        return [((m.headers or {}).get("Nats-Msg-Id", ""), m.data or b"") for m in messages]
    finally:
        await nc.close()


def stored(url: str) -> list[tuple[str, bytes]]:
    return asyncio.run(_stored(url))


def publish(url: str, events: Path, spool: Path) -> None:
    assert main(["publish", "--nats", url, "--events", str(events), "--spool", str(spool)]) == 0


def sample_file(tmp_path: Path) -> Path:
    path = tmp_path / "sample.jsonl"
    path.write_bytes(orjson.dumps(SAMPLE) + b"\n")
    return path


def test_two_nodes_publishing_the_same_body_are_both_stored(
    nats_server: NatsServer, tmp_path: Path
) -> None:
    """With the body's SHA-256 as the id, whichever node published first had the other's
    event dropped as a duplicate."""
    events = sample_file(tmp_path)
    publish(nats_server.url, events, tmp_path / "node-a")  # the attacker, first
    publish(nats_server.url, events, tmp_path / "node-b")  # the victim's own event
    messages = stored(nats_server.url)
    assert len(messages) == 2 and messages[0][1] == messages[1][1]
    assert messages[0][0] != messages[1][0]


def test_a_node_publishing_the_same_events_again_stores_them_once(
    nats_server: NatsServer, tmp_path: Path
) -> None:
    """A second run (a retry after a lost ack) has the same ids: its key is kept."""
    events = node_files("attack")["gpu-101"]
    publish(nats_server.url, events, tmp_path / "spool")
    first = stored(nats_server.url)
    publish(nats_server.url, events, tmp_path / "spool")
    assert stored(nats_server.url) == first
    key = (tmp_path / "spool" / MESSAGE_KEY).read_bytes()
    # the id is keyed, not the body's bare digest another node could compute
    for ident, body in first:
        digest = hashlib.sha256(body).hexdigest()[:32]
        assert ident == message_id(key, digest) != digest


def test_forwarders_of_two_nodes_both_store_the_same_event(
    nats_server: NatsServer, tmp_path: Path
) -> None:
    forwarders = [EventForwarder([nats_server.url]) for _ in range(2)]
    try:
        for forwarder in forwarders:
            forwarder.submit([dict(SAMPLE)])
        wait_for(lambda: sum(f.stats.published for f in forwarders) == 2, 30, "both sent")
    finally:
        assert all(f.close(5) == 0 for f in forwarders)
    assert len(stored(nats_server.url)) == 2


def test_the_key_is_private_and_kept_across_runs(tmp_path: Path) -> None:
    spool = tmp_path / "spool"
    key = message_key(spool)
    assert len(key) == 32 and message_key(spool) == key
    assert (spool / MESSAGE_KEY).read_bytes() == key
    assert (spool / MESSAGE_KEY).stat().st_mode & 0o777 == 0o600
    assert spool.stat().st_mode & 0o777 == 0o700
    assert message_key(tmp_path / "other") != key


def test_the_agent_and_hpcsec_publish_share_the_node_key(tmp_path: Path) -> None:
    spool = tmp_path / "spool"
    tap = NatsTap(["nats://127.0.0.1:1"], spool, 1024**2)  # NATS down: only the key matters
    try:
        assert tap.message_key == message_key(spool) == (spool / MESSAGE_KEY).read_bytes()
    finally:
        tap.close(0)


def test_a_key_made_meanwhile_by_another_process_is_taken(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spool = tmp_path / "spool"
    theirs = os.urandom(32)
    link = os.link

    def another_process_first(source: str, target: str) -> None:
        Path(target).write_bytes(theirs)
        os.chmod(target, 0o600)
        link(source, target)

    monkeypatch.setattr(msgid.os, "link", another_process_first)
    assert message_key(spool) == theirs
    assert [p.name for p in spool.iterdir()] == [MESSAGE_KEY]  # no temporary file left


def test_a_damaged_key_is_replaced(tmp_path: Path) -> None:
    spool = tmp_path / "spool"
    spool.mkdir(mode=0o700)
    (spool / MESSAGE_KEY).write_bytes(b"short")
    os.chmod(spool / MESSAGE_KEY, 0o600)
    key = message_key(spool)
    assert len(key) == 32 and (spool / MESSAGE_KEY).read_bytes() == key


def _refused(spool: Path, reason: str) -> None:
    with pytest.raises(MessageKeyError, match=f"refusing the NATS message-id key .*{reason}"):
        message_key(spool)


def test_a_symlinked_key_file_is_refused_and_its_target_left_alone(tmp_path: Path) -> None:
    spool = tmp_path / "spool"
    message_key(spool)
    target = tmp_path / "elsewhere"
    target.write_bytes(b"x" * 32)
    (spool / MESSAGE_KEY).unlink()
    (spool / MESSAGE_KEY).symlink_to(target)
    _refused(spool, "it is a symbolic link")
    assert target.read_bytes() == b"x" * 32


def test_a_key_file_others_can_read_is_refused(tmp_path: Path) -> None:
    spool = tmp_path / "spool"
    message_key(spool)
    os.chmod(spool / MESSAGE_KEY, 0o644)
    _refused(spool, r"others may read or change it \(mode 0644\)")


@pytest.mark.skipif(os.geteuid() != 0, reason="changing a file's owner needs root")
def test_a_key_file_of_another_user_is_refused(tmp_path: Path) -> None:
    spool = tmp_path / "spool"
    message_key(spool)
    os.chown(spool / MESSAGE_KEY, 65534, 65534)
    _refused(spool, "it belongs to uid 65534, not to us")


def test_hpcsec_publish_says_why_it_refuses_a_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spool = tmp_path / "spool"
    spool.mkdir(mode=0o700)
    (spool / MESSAGE_KEY).symlink_to(tmp_path / "elsewhere")
    args = ["publish", "--nats", "nats://127.0.0.1:1", "--events", str(sample_file(tmp_path))]
    assert main([*args, "--spool", str(spool)]) == 2
    err = capsys.readouterr().err
    assert err == (
        f"hpcsec: error: refusing the NATS message-id key {spool / MESSAGE_KEY}: it is a "
        "symbolic link; remove it and a new key is made\n"
    )
    os.chmod(spool, 0o777)  # a spool directory others can write: refused as the agent's is
    (spool / MESSAGE_KEY).unlink()
    assert main([*args, "--spool", str(spool)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("hpcsec: error: cannot keep the NATS message-id key: refusing")
    assert "writable by group or others" in err and "Traceback" not in err

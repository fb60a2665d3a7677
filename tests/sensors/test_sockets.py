"""The sockets sensor: sock_diag for real on 127.0.0.1, and sockets.json replays."""

from __future__ import annotations

import json
import os
import socket

from snapshot_builder import NodeTree

from hpcsec.sensors.base import FsRoot, SensorContext
from hpcsec.sensors.sockets import SocketSensor, parse_sockets


def live_context() -> SensorContext:
    return SensorContext(
        "live", FsRoot("sys", "/sys"), FsRoot("proc", "/proc"), FsRoot("etc", "/etc")
    )


def test_finds_listening_and_established_sockets_with_their_pid():
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    port = server.getsockname()[1]
    client = socket.create_connection(("127.0.0.1", port))
    accepted, _ = server.accept()
    try:
        events = list(SocketSensor().collect(live_context()))
        mine = [e for e in events if port in (e.get("source.port"), e.get("destination.port"))]
        by_state = {(e["network.state"], e["source.port"]): e for e in mine}
        listen = by_state[("LISTEN", port)]
        assert listen["network.transport"] == "tcp"
        assert listen["source.ip"] == "127.0.0.1"
        assert listen["process.pid"] == os.getpid()
        assert listen["network.inode"] == os.fstat(server.fileno()).st_ino
        outgoing = by_state[("ESTABLISHED", client.getsockname()[1])]
        assert outgoing["destination.ip"] == "127.0.0.1"
        assert outgoing["destination.port"] == port
        assert outgoing["process.pid"] == os.getpid()
        assert outgoing["user.id"] == os.getuid()
        assert ("ESTABLISHED", port) in by_state  # the accepted end
    finally:
        for s in (accepted, client, server):
            s.close()


def test_udp_socket_is_unconn():
    udp = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
    udp.bind(("::1", 0))
    try:
        port = udp.getsockname()[1]
        inode = os.fstat(udp.fileno()).st_ino
        events = [
            e
            for e in SocketSensor().collect(live_context())
            # by inode: another process may hold the same port number on another address
            if e["network.transport"] == "udp" and e.get("network.inode") == inode
        ]
        assert [
            (e["network.state"], e["source.ip"], e["source.port"], e["process.pid"]) for e in events
        ] == [("UNCONN", "::1", port, os.getpid())]
    finally:
        udp.close()


def test_replays_sockets_json_with_the_nodes_users(tmp_path):
    node = NodeTree(tmp_path)
    node.passwd(("root", 0), ("bob", 1002))
    node.process(
        5100,
        "jupyter-lab",
        ["/opt/conda/bin/python", "-m", "jupyterlab"],
        uid=1002,
        fds={3: "socket:[88001]"},
    )
    ctx = node.context()
    ctx.replay_inputs = {
        "sockets.json": json.dumps(
            [
                {
                    "transport": "tcp",
                    "state": "LISTEN",
                    "source.ip": "0.0.0.0",
                    "source.port": 8888,
                    "destination.ip": "0.0.0.0",
                    "destination.port": 0,
                    "inode": 88001,
                    "pid": 5100,
                },
                {"transport": "sctp", "source.port": 1, "inode": 2},
            ]
        )
    }
    events = list(SocketSensor().collect(ctx))
    assert events[0]["event.action"] == "malformed"
    assert events[0]["hpcsec.malformed"] == 1
    (jupyter,) = events[1:]
    assert jupyter["source.port"] == 8888
    assert jupyter["network.state"] == "LISTEN"
    assert jupyter["process.name"] == "jupyter-lab"
    assert jupyter["user.name"] == "bob"


def test_bad_sockets_json_is_reported_not_raised(tmp_path):
    ctx = NodeTree(tmp_path).context()
    ctx.replay_inputs = {"sockets.json": "{not json"}
    (status,) = SocketSensor().collect(ctx)
    assert status["event.action"] == "malformed"
    assert status["message"].startswith("sockets.json: Expecting property name")


def test_parse_rejects_non_list():
    try:
        parse_sockets('{"a": 1}')
    except ValueError as exc:
        assert str(exc) == "sockets.json: expected a JSON list"
    else:
        raise AssertionError("no error")

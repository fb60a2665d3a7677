"""rdma_qp: iproute2 `rdma res show qp` output (JSON and text), kernel QPs, absent tool."""

import json
import os
import shutil
import stat
from pathlib import Path

import pytest

from hpcsec.detector.cli import main as cli
from hpcsec.detector.runtime.registry import by_name
from hpcsec.sensors.base import FsRoot, SensorContext, SensorUnavailable, run_sensor
from hpcsec.sensors.rdma.qp import (
    INPUT_NAME,
    QpOutputError,
    QueuePair,
    RdmaQpSensor,
    parse_qp_json,
    parse_qp_output,
    parse_qp_text,
    rdma_output,
)

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "rdma"


def _ctx(tmp_path, replay=None):
    root = FsRoot("sys", tmp_path)
    return SensorContext(
        "gpu-017", root, root, root, timestamp="2026-11-30T00:00:00.000Z", replay_inputs=replay
    )


def _fixture(name):
    return (FIXTURES / name).read_text()


def test_json_fixture_parses_every_qp():
    parsed = parse_qp_json(_fixture("res-qp.json"))
    assert parsed.errors == ()
    assert len(parsed.qps) == 22
    assert parsed.qps[0] == QueuePair("mlx5_0", 1, 0, "SMI", "RTS", sq_psn=0, comm="ib_core")
    nccl = parsed.qps[9]
    assert nccl == QueuePair(
        "mlx5_0",
        1,
        4735,
        "RC",
        "RTS",
        rqpn=6114,
        sq_psn=10442381,
        rq_psn=13310071,
        path_mig_state="MIGRATED",
        pdn=9,
        pid=41000,
        comm="python3",
    )
    types = sorted({qp.qp_type for qp in parsed.qps})
    assert types == ["DRIVER", "GSI", "RC", "SMI", "UC", "UD", "XRC_INI"]
    kernel_owners = sorted({qp.comm for qp in parsed.qps if qp.kernel})
    assert kernel_owners == ["ib_core", "ib_ipoib", "ko2iblnd", "nvme_rdma"]


def test_text_fixture_agrees_with_json_fixture():
    from_text = parse_qp_text(_fixture("res-qp.txt"))
    assert from_text.errors == ()
    assert from_text.qps == parse_qp_json(_fixture("res-qp.json")).qps
    assert parse_qp_output(_fixture("res-qp.txt")).qps == from_text.qps


def test_events_user_and_kernel_qps(tmp_path):
    events = RdmaQpSensor().collect(_ctx(tmp_path, {INPUT_NAME: _fixture("res-qp.json")}))
    assert len(events) == 22
    gsi = events[1]
    assert {k: v for k, v in gsi.items() if k.startswith(("rdma.", "process."))} == {
        "rdma.device": "mlx5_0",
        "rdma.port": 1,
        "rdma.qp.lqpn": 1,
        "rdma.qp.type": "GSI",
        "rdma.qp.state": "RTS",
        "rdma.qp.sq_psn": 0,
        "rdma.qp.kernel": True,
        "rdma.qp.kernel_owner": "ib_core",
    }
    assert gsi["event.category"] == "rdma_qp"
    assert gsi["event.action"] == "sample"
    rogue = next(e for e in events if e["rdma.qp.lqpn"] == 4801)
    assert {k: v for k, v in rogue.items() if k.startswith(("rdma.", "process."))} == {
        "rdma.device": "mlx5_2",
        "rdma.port": 1,
        "rdma.qp.lqpn": 4801,
        "rdma.qp.rqpn": 301,
        "rdma.qp.type": "RC",
        "rdma.qp.state": "RTS",
        "rdma.qp.sq_psn": 9927411,
        "rdma.qp.rq_psn": 5512,
        "rdma.qp.path_mig_state": "MIGRATED",
        "rdma.qp.pdn": 2,
        "rdma.qp.kernel": False,
        "process.pid": 52311,
        "process.name": "ib_write_bw",
    }
    unbound = next(e for e in events if e["rdma.qp.lqpn"] == 4803)
    assert "rdma.port" not in unbound
    assert unbound["rdma.qp.state"] == "RESET"
    exited = next(e for e in events if e["rdma.qp.lqpn"] == 4743)
    assert exited["process.pid"] == 41077
    assert "process.name" not in exited
    assert exited["rdma.qp.kernel"] is False


def test_old_iproute2_pid_zero_means_kernel():
    parsed = parse_qp_text(
        "link mlx5_0/1 lqpn 1 type GSI state RTS sq-psn 0 pid 0 comm [ib_core]\n"
    )
    (qp,) = parsed.qps
    assert qp.kernel
    assert qp.fields()["rdma.qp.kernel_owner"] == "ib_core"
    assert "process.pid" not in {k for k, v in qp.fields().items() if v is not None}


def test_a_comm_with_a_carriage_return_is_no_second_qp():
    """A user names its own process; `rdma` prints the name raw, last, in its text form:
    neither a `\r` nor words in it make another line or other fields."""
    parsed = parse_qp_text(
        "link mlx5_0/1 lqpn 9 type RC state RTS sq-psn 0 pid 4242 comm x\r"
        "link mlx5_0/1 lqpn 1 type RC state RTS sq-psn 0 pid 0 comm [ib_core]\n"
        "link mlx5_0/1 lqpn 10 type RC state RTS sq-psn 0 pid 4243 comm a pid 0 \n"
    )
    assert parsed.errors == ()
    assert [(qp.lqpn, qp.kernel, qp.fields()["process.pid"]) for qp in parsed.qps] == [
        (9, False, 4242),
        (10, False, 4243),
    ]
    assert parsed.qps[1].fields()["process.name"] == "a pid 0"


def test_comms_that_older_iproute2_does_not_escape_lose_no_qp():
    """Before 7.0 iproute2 writes a comm's control bytes raw in its JSON, and 5.3-6.0 write
    `'` as `\\'`: one process's name made the whole listing "not JSON"."""
    record = '{"ifname":"mlx5_0","port":1,"lqpn":%d,"type":"RC","state":"RTS","pid":%d,"comm":"%s"}'
    # in the JSON: it\'s, x^Ay, a\\ (an escaped backslash), b\\\' (one, then \')
    names = ["it\\'s", "x\x01y", "a\\\\", "b\\\\\\'"]
    text = "[" + ",".join(record % (7 + i, 9 + i, n) for i, n in enumerate(names)) + "]"
    parsed = parse_qp_output(text)
    assert parsed.errors == ()
    assert [(qp.lqpn, qp.fields()["process.name"]) for qp in parsed.qps] == [
        (7, "it's"),
        (8, "x\x01y"),
        (9, "a\\"),
        (10, "b\\'"),
    ]


def test_empty_output_is_no_qps():
    assert parse_qp_output("[]\n").qps == ()
    assert parse_qp_output("").qps == ()


def test_malformed_records_are_skipped_and_reported(tmp_path):
    text = (
        '[{"ifname":"mlx5_0","port":1,"lqpn":7,"type":"RC","state":"RTS","pid":9,'
        '"comm":"a.out"},'
        '{"ifname":"mlx5_0","port":1,"type":"RC","state":"RTS"},'
        '{"ifname":"mlx5_0","port":"one","lqpn":8,"type":"RC","state":"RTS"},'
        '{"ifname":"mlx5_0","lqpn":-3,"type":"RC","state":"RTS"},'
        '"junk"]'
    )
    events = RdmaQpSensor().collect(_ctx(tmp_path, {INPUT_NAME: text}))
    assert [e["rdma.qp.lqpn"] for e in events[:-1]] == [7]
    status = events[-1]
    assert status["event.category"] == "sensor_status"
    assert status["event.action"] == "dropped"
    assert status["message"] == "4 QP records skipped as malformed"
    assert status["hpcsec.parse_errors"] == [
        "record 2: no lqpn",
        "record 3: port is not a 32-bit unsigned integer: 'one'",
        "record 4: lqpn is not a 32-bit unsigned integer: -3",
        "record 5: not an object: str",
    ]


def test_malformed_text_lines_are_counted():
    parsed = parse_qp_text(
        "link mlx5_0/1 lqpn 3 type UD state RTS sq-psn 0 pid 5 comm x\n"
        "link mlx5_0/1 lqpn\n"
        "link mlx5_0 lqpn 4 type UD state RTS\n"
    )
    assert [qp.lqpn for qp in parsed.qps] == [3]
    assert parsed.errors == (
        "record 2: odd number of words in 'link mlx5_0/1 lqpn'",
        "record 3: bad link 'mlx5_0'",
    )


def test_not_json_is_an_error_status_not_a_crash(tmp_path):
    with pytest.raises(QpOutputError, match=r"^rdma-res-qp.json: not JSON: Expecting"):
        parse_qp_json('[{"ifname": "mlx5_0",')
    with pytest.raises(QpOutputError, match="expected a JSON list, got dict"):
        parse_qp_json('{"ifname": "mlx5_0"}')
    run = run_sensor(
        by_name()["rdma_qp"], RdmaQpSensor(), _ctx(tmp_path, {INPUT_NAME: '[{"ifname": "mlx5_0",'})
    )
    assert run.events == []
    assert run.status["event.action"] == "error"
    assert run.status["message"].startswith("QpOutputError: rdma-res-qp.json: not JSON:")


def test_snapshot_without_the_input_is_unavailable(tmp_path):
    with pytest.raises(SensorUnavailable, match=r"^no rdma-res-qp\.json in this sample$"):
        RdmaQpSensor().collect(_ctx(tmp_path, {}))


def _fake_rdma(tmp_path, script):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    tool = bin_dir / "rdma"
    tool.write_text("#!/bin/sh\n" + script)
    tool.chmod(tool.stat().st_mode | stat.S_IXUSR)
    return str(bin_dir) + os.pathsep + os.environ["PATH"]


def test_missing_tool_is_unavailable(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(SensorUnavailable, match=r"^iproute2 `rdma` tool not found$"):
        "".join(rdma_output())


def test_missing_netlink_family_is_unavailable(tmp_path, monkeypatch):
    monkeypatch.setenv(
        "PATH", _fake_rdma(tmp_path, 'echo "Failed to open NETLINK_RDMA socket" >&2\nexit 1\n')
    )
    with pytest.raises(SensorUnavailable) as err:
        "".join(rdma_output())
    assert str(err.value) == ("`rdma -j res show qp` failed: Failed to open NETLINK_RDMA socket")


def test_live_run_goes_through_the_tool_and_is_recorded(tmp_path, monkeypatch):
    monkeypatch.setenv(
        "PATH",
        _fake_rdma(
            tmp_path, f'[ "$*" = "-j res show qp" ] || exit 3\ncat {FIXTURES}/res-qp.json\n'
        ),
    )

    class Rec:
        inputs = {}

        def record_input(self, name, data):
            self.inputs[name] = data

    ctx = _ctx(tmp_path)
    ctx.recorder = Rec()
    events = RdmaQpSensor().collect(ctx)
    assert len(events) == 22
    assert Rec.inputs == {INPUT_NAME: _fixture("res-qp.json")}


@pytest.mark.skipif(
    shutil.which("rdma") is None or os.path.exists("/sys/class/infiniband"),
    reason="needs iproute2 `rdma` on a node without RDMA devices",
)
def test_real_rdma_tool_without_rdma_netlink(tmp_path):
    with pytest.raises(SensorUnavailable, match=r"^`rdma -j res show qp` failed: "):
        "".join(rdma_output())


def test_collect_cli_without_rdma_netlink_is_one_status_line_and_record(
    tmp_path, monkeypatch, capsys
):
    monkeypatch.setenv(
        "PATH", _fake_rdma(tmp_path, 'echo "Failed to open NETLINK_RDMA socket" >&2\nexit 1\n')
    )
    assert cli.main(["collect", "--sensor", "rdma_qp", "--raw"]) == 0
    out, err = capsys.readouterr()
    message = "`rdma -j res show qp` failed: Failed to open NETLINK_RDMA socket"
    assert err == f"hpcsec: sensor rdma_qp: unavailable: {message}\n"
    (record,) = [json.loads(line) for line in out.splitlines()]
    assert (record["event.category"], record["event.action"], record["message"]) == (
        "sensor_status",
        "unavailable",
        message,
    )


def test_collect_cli_prints_the_qps(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("PATH", _fake_rdma(tmp_path, f"cat {FIXTURES}/res-qp.json\n"))
    assert cli.main(["collect", "--sensor", "rdma_qp", "--raw", "--host-name", "gpu-017"]) == 0
    out, err = capsys.readouterr()
    assert err == "hpcsec: sensor rdma_qp: ok: 22 events\n"
    records = [json.loads(line) for line in out.splitlines()]
    assert [r["event.category"] for r in records] == ["rdma_qp"] * 22 + ["sensor_status"]
    assert sum(1 for r in records[:-1] if r["rdma.qp.kernel"]) == 11


def _qps(*owners):
    """`rdma -j` output: (pid or None for the kernel, device, count) per owner, in turn."""
    out, lqpn = [], 100
    for pid, device, count in owners:
        for _ in range(count):
            lqpn += 1
            qp = {"ifname": device, "port": 1, "lqpn": lqpn, "type": "RC", "state": "RTS"}
            qp.update({"pid": pid, "comm": f"p{pid}"} if pid else {"comm": "ko2iblnd"})
            out.append(qp)
    return json.dumps(out)


def test_a_process_with_thousands_of_qps_is_listed_up_to_a_bound_and_counted(tmp_path):
    """QPs need no privilege: 200,000 of them cost the agent 15 s of CPU and 380 MB a sample.
    A process's QPs on a device past 256 are counted on its last listed one; kernel QPs (a
    storage client's, one per peer) are all listed."""
    text = _qps((7, "mlx5_0", 300), (7, "mlx5_1", 3), (8, "mlx5_0", 10), (None, "mlx5_0", 400))
    events = RdmaQpSensor().collect(_ctx(tmp_path, {INPUT_NAME: text}))
    by_owner: dict = {}
    for event in events:
        key = (event.get("process.pid"), event["rdma.device"])
        by_owner.setdefault(key, []).append(event)
    assert {k: len(v) for k, v in by_owner.items()} == {
        (7, "mlx5_0"): 256,
        (7, "mlx5_1"): 3,
        (8, "mlx5_0"): 10,
        (None, "mlx5_0"): 400,
    }
    assert by_owner[(7, "mlx5_0")][-1]["rdma.qp.not_listed"] == 44
    assert sum("rdma.qp.not_listed" in e for e in events) == 1


def test_many_qps_of_some_processes_hide_no_other_process_and_the_rest_is_counted(
    tmp_path, monkeypatch
):
    """Filler processes with many QPs each used up the sample's room, and a process whose QP
    came later in the output got no event at all: every process's first QP is listed before
    any other's second. Only processes past the sample's bound of distinct ones are dropped."""
    from hpcsec.sensors.rdma import qp as qp_module

    monkeypatch.setattr(qp_module, "MAX_LISTED_PER_PROCESS", 5)
    monkeypatch.setattr(qp_module, "MAX_LISTED_QPS", 12)
    fillers = [(pid, "mlx5_0", 8) for pid in range(1, 4)]
    text = _qps(*fillers, (99, "mlx5_0", 1), (None, "mlx5_0", 2))
    events = RdmaQpSensor().collect(_ctx(tmp_path, {INPUT_NAME: text}))
    assert [e.get("process.pid") for e in events] == [1] * 5 + [2] * 5 + [3, 99, None, None]
    assert [e.get("rdma.qp.not_listed") for e in events if "rdma.qp.not_listed" in e] == [3, 3, 7]
    monkeypatch.setattr(qp_module, "MAX_LISTED_QPS", 2)  # fewer than the processes
    events = RdmaQpSensor().collect(_ctx(tmp_path, {INPUT_NAME: text}))
    *qps, status = events
    assert [e.get("process.pid") for e in qps] == [1, 2, None, None]
    assert (status["event.action"], status["hpcsec.dropped"]) == ("dropped", 8 + 1)

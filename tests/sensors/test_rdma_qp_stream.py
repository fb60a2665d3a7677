"""rdma_qp on outputs of any size: read as it arrives, one record at a time, keeping only
what a sample can list; the same events whatever the chunks, and what is cut is reported."""

from __future__ import annotations

import json
import os
import random
import re
import stat
import time
import tracemalloc
from typing import Any

import orjson
import pytest

from hpcsec.detector.runtime.registry import by_name
from hpcsec.sensors import base
from hpcsec.sensors.base import FsRoot, SensorContext, run_sensor
from hpcsec.sensors.rdma import qp as qp_module
from hpcsec.sensors.rdma.qp import (
    INPUT_NAME,
    QpOutputError,
    QueuePair,
    RdmaQpSensor,
    bounded,
    parse_qp_output,
    rdma_output,
    read_qps,
)


def _ctx(tmp_path, replay=None, recorder=None):
    root = FsRoot("sys", tmp_path)
    return SensorContext(
        "gpu-017",
        root,
        root,
        root,
        timestamp="2026-11-30T00:00:00.000Z",
        replay_inputs=replay,
        recorder=recorder,
    )


def _fake_rdma(tmp_path, monkeypatch, script: str) -> None:
    """An `rdma` on PATH that runs `script` (sh)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    tool = bin_dir / "rdma"
    tool.write_text("#!/bin/sh\n" + script)
    tool.chmod(tool.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", str(bin_dir) + os.pathsep + os.environ["PATH"])


def _record(lqpn: int, pid: int | None, device: str = "mlx5_0", comm: str = "") -> str:
    qp: dict[str, Any] = {"ifname": device, "port": 1, "lqpn": lqpn, "type": "RC"}
    qp["state"] = "RTS"
    qp.update({"pid": pid, "comm": comm or f"p{pid}"} if pid else {"comm": "ko2iblnd"})
    return json.dumps(qp, separators=(",", ":"))


class _Rec:
    def __init__(self):
        self.inputs: dict[str, str] = {}

    def record_input(self, name, data):
        self.inputs[name] = data


# --- the one-pass selection against the two-pass one it replaces ----------------------------


def two_pass_bounded(qps):
    """`bounded` as it was (two passes over every QP of the output), the reference."""
    max_listed, per_process = qp_module.MAX_LISTED_QPS, qp_module.MAX_LISTED_PER_PROCESS
    first: dict[tuple[int, str], int] = {}
    for i, qp in enumerate(qps):
        if not qp.kernel and len(first) < max_listed:
            first.setdefault((qp.pid or 0, qp.device), i)
    room = max_listed - len(first)
    listed: list[dict[str, Any]] = []
    last: dict[tuple[int, str], dict[str, Any]] = {}
    counts: dict[tuple[int, str], int] = {}
    dropped = 0
    for i, qp in enumerate(qps):
        if qp.kernel:
            listed.append(qp.fields())
            continue
        owner = (qp.pid or 0, qp.device)
        count = counts[owner] = counts.get(owner, 0) + 1
        if first.get(owner) == i or (owner in first and count <= per_process and room > 0):
            room -= first.get(owner) != i
            listed.append(fields := qp.fields())
            last[owner] = fields
        elif owner in last:
            fields = last[owner]
            fields["rdma.qp.not_listed"] = fields.get("rdma.qp.not_listed", 0) + 1
        else:
            dropped += 1
    return listed, dropped


def _random_qps(rng: random.Random) -> list[QueuePair]:
    """Owners arriving in bursts and interleaved, kernel QPs among them, pid 0 (kernel)."""
    owners = [(rng.randint(0, 9), rng.choice(["mlx5_0", "mlx5_1"])) for _ in range(12)]
    qps = []
    for lqpn in range(rng.randint(0, 80)):
        pid, device = rng.choice(owners[: rng.randint(1, len(owners))])
        if rng.random() < 0.15:
            pid = rng.choice([0, None])  # a kernel QP (old iproute2 printed pid 0)
        for _ in range(rng.choice([1, 1, 1, 4])):  # bursts of one owner's QPs
            qps.append(QueuePair(device, 1, lqpn, "RC", "RTS", pid=pid, comm=f"c{pid}"))
    return qps


def test_one_pass_selection_lists_what_the_two_pass_one_did(monkeypatch):
    """The selection now sees each QP once and keeps only the listed ones (it lets the last
    listed others go as new owners shrink the room): the same events, `not_listed` counts
    and dropped count as the two passes over the whole output, on many outputs."""
    rng = random.Random(20261130)
    for case in range(1500):
        monkeypatch.setattr(qp_module, "MAX_LISTED_QPS", rng.choice([0, 1, 2, 3, 5, 8, 13]))
        monkeypatch.setattr(qp_module, "MAX_LISTED_PER_PROCESS", rng.choice([0, 1, 2, 3, 6]))
        qps = _random_qps(rng)
        assert bounded(qps) == two_pass_bounded(qps), f"case {case}"


def test_one_pass_selection_through_the_sensor(tmp_path, monkeypatch):
    """The same through the whole reading (records, selection, events), chunked."""
    rng = random.Random(7)
    for case in range(300):
        monkeypatch.setattr(qp_module, "MAX_LISTED_QPS", rng.choice([1, 2, 4, 9]))
        monkeypatch.setattr(qp_module, "MAX_LISTED_PER_PROCESS", rng.choice([1, 2, 5]))
        qps = _random_qps(rng)
        text = "[" + ",".join(_record(q.lqpn, q.pid, q.device, q.comm or "") for q in qps) + "]"
        size = rng.randint(1, 40)
        sample = read_qps(text[i : i + size] for i in range(0, len(text), size))
        assert (sample.listed, sample.dropped) == two_pass_bounded(parse_qp_output(text).qps), (
            f"case {case}"
        )


# --- records: every form iproute2 writes, whatever the chunks --------------------------------

HOSTILE = (
    "["
    '{"ifname":"mlx5_0","port":1,"lqpn":1,"type":"GSI","state":"RTS","comm":"ib_core"},'
    # a `}` and `},{` in a comm: the first `}` is not the record's end
    '{"ifname":"mlx5_0","port":1,"lqpn":2,"type":"RC","state":"RTS","pid":7,"comm":"a},{b}"},'
    # `\'` (iproute2 5.3-6.0) and a raw control byte (before 7.0): not JSON, read anyway
    '{"ifname":"mlx5_0","port":1,"lqpn":3,"type":"RC","state":"RTS","pid":8,"comm":"it\\\'s"},'
    '{"ifname":"mlx5_0","port":1,"lqpn":4,"type":"RC","state":"RTS","pid":9,"comm":"x\x01y"},'
    # bytes that are not UTF-8, as surrogateescape gives them
    '{"ifname":"mlx5_0","port":1,"lqpn":5,"type":"RC","state":"RTS","pid":10,"comm":"\udcff"},'
    # a name that is not ASCII, an escaped quote and backslash
    '{"ifname":"mlx5_0","port":1,"lqpn":6,"type":"RC","state":"RTS","pid":11,"comm":"\u00e9\\"\\\\"},'
    # white space, a nested object, an integer past 64 bits, not objects
    ' {"ifname":"mlx5_0", "lqpn":7, "type":"UD", "state":"RTS", "x":{"y":[1,{"}":2}]}} ,\n'
    '{"ifname":"mlx5_0","lqpn":99999999999999999999999,"type":"RC","state":"RTS"},'
    '"junk",[1,2],null,'
    # not JSON: costs its own record only
    '{"ifname":"mlx5_0","lqpn":8 "type":"RC"},'
    '{"ifname":"mlx5_1","port":2,"lqpn":9,"type":"RC","state":"RTS","pid":12,"comm":"ok"}'
    "]\n"
)


def _chunkings(text: str):
    yield [text]
    for size in (1, 2, 3, 7, 64):
        yield [text[i : i + size] for i in range(0, len(text), size)]
    rng = random.Random(3)
    for _ in range(20):
        cuts = sorted(rng.sample(range(1, len(text)), min(6, len(text) - 1)))
        yield [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)]


def test_hostile_records_give_the_same_qps_whatever_the_chunks():
    expected = (
        [1, 2, 3, 4, 5, 6, 7, 9],
        [
            "record 8: lqpn is not a 32-bit unsigned integer: 99999999999999999999999",
            "record 9: not an object: str",
            "record 10: not an object: list",
            "record 11: not an object: NoneType",
            "record 12: not JSON: Expecting ',' delimiter",
        ],
    )
    names = [None, "a},{b}", "it's", "x\x01y", "\\xff", 'é"\\', None, "ok"]
    for chunks in _chunkings(HOSTILE):
        sample = read_qps(iter(chunks))
        assert ([e["rdma.qp.lqpn"] for e in sample.listed], list(sample.first_errors)) == expected
        assert [e["process.name"] for e in sample.listed] == names
        assert (sample.errors, sample.records, sample.cut) == (5, 13, None)


def test_the_text_form_whatever_the_chunks():
    text = (
        "\n  link mlx5_0/1 lqpn 1 type GSI state RTS sq-psn 0 comm [ib_core]\n\n"
        "link mlx5_0/1 lqpn 9 type RC state RTS pid 4242 comm x\ry z\n"
        "link mlx5_0/- lqpn\n"
        "link mlx5_1/1 lqpn 10 type RC state RTS pid 4243 comm a pid 0"
    )
    for chunks in _chunkings(text):
        sample = read_qps(iter(chunks))
        assert [(e["rdma.qp.lqpn"], e["process.name"]) for e in sample.listed] == [
            (1, None),
            (9, "x\ry z"),
            (10, "a pid 0"),
        ]
        assert sample.first_errors == ("record 3: odd number of words in 'link mlx5_0/- lqpn'",)


def test_one_record_that_is_not_json_costs_only_itself():
    """The whole output used to be "not JSON" for one bad record: every QP of the node lost."""
    text = "[" + _record(1, 7) + ',{"ifname":"mlx5_0","lqpn":2 "type":"RC"},' + _record(3, 8) + "]"
    sample = read_qps([text])
    assert [e["rdma.qp.lqpn"] for e in sample.listed] == [1, 3]
    assert sample.first_errors == ("record 2: not JSON: Expecting ',' delimiter",)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[" + _record(1, 7), r"not JSON: Expecting ',' delimiter \(the output ends in record 1\)"),
        ("[" + _record(1, 7) + ",", r"not JSON: Expecting value \(the output ends in record 2\)"),
        ('[{"comm":"ab', r"not JSON: Unterminated string .*\(the output ends in record 1\)"),
        ("[" + _record(1, 7) + "] x", "not JSON: Extra data after the list"),
        ("[1}", r"not JSON: '}' after record 1, not ',' or ']'"),
        ("[]]", "not JSON: Extra data after the list"),
        ('"x"', "expected a JSON list, got str"),
        ("{1", "not JSON: Expecting property name"),
    ],
)
def test_outputs_that_are_not_a_json_list(text, message):
    for chunks in _chunkings(text):
        with pytest.raises(QpOutputError, match=f"^{INPUT_NAME}: {message}"):
            read_qps(chunks) if text[0] in "[{" else qp_module.parse_qp_json(text)


def test_fast_reading_agrees_with_the_reference_one():
    """orjson and the one-expression check read the usual record; whenever they accept one,
    the reference parse (json, every key checked in turn) gives the same QP, and for one
    they refuse it says why. Records of every kind of value at every key."""
    rng = random.Random(11)
    kinds = [
        None,
        0,
        1,
        41000,
        (1 << 32) - 1,
        1 << 32,
        -1,
        1 << 70,
        True,
        1.0,
        "",
        "RC",
        "\u00e9",
        "\udcff",
        "x\x01",
        [1],
        {"a": 1},
    ]
    keys = ["ifname", "port", "lqpn", "type", "state", "rqpn", "sq-psn", "rq-psn"]
    keys += ["path-mig-state", "pdn", "pid", "comm"]
    valid = {"ifname": "mlx5_0", "lqpn": 3, "type": "RC", "state": "RTS", "pid": 7}
    for _ in range(4000):
        record = dict(valid)
        for key in rng.sample(keys, rng.randint(0, 3)):
            if rng.random() < 0.2:
                record.pop(key, None)
            else:
                record[key] = rng.choice(kinds)
        text = json.dumps(record, ensure_ascii=False)
        try:  # every key checked in turn, as before
            reference: Any = qp_module._checked_values(json.loads(text))
        except ValueError as exc:
            reference = str(exc)
        fast = qp_module._plain_values(json.loads(text))
        assert fast is None or fast == reference, text
        try:
            orjson.loads(text)
        except orjson.JSONDecodeError:
            continue  # read by the reference parse only
        read = qp_module._orjson_qp(text)
        assert (str(read) if isinstance(read, ValueError) else read) == reference, text


# --- bounds ------------------------------------------------------------------------------------


def test_a_record_longer_than_iproute2_writes_stops_the_reading(tmp_path, monkeypatch):
    """An endless string is not buffered: the reading stops at the record bound and the tool
    is killed (it used to be read whole, then found not JSON)."""
    _fake_rdma(tmp_path, monkeypatch, 'printf \'[{"comm":"\'\nhead -c 20000000 /dev/zero\n')
    run = run_sensor(by_name()["rdma_qp"], RdmaQpSensor(), _ctx(tmp_path))  # live, the agent's
    assert run.status["event.action"] == "error"
    assert run.status["message"] == (
        "QpOutputError: rdma-res-qp.json: record 1 is longer than 65536 characters: "
        "not iproute2's output"
    )
    for head, message in (
        ("[" + _record(1, 7) + ',{"comm":"', "record 2 is longer than 65536"),
        ("link mlx5_0/1 lqpn 1 comm ", "record 1 is longer than 65536"),  # the text form
    ):
        endless = _Endless(head)
        with pytest.raises(QpOutputError, match=message):
            read_qps(endless)
        assert endless.given <= 70_000  # no more than the bound is read, so none is held


class _Endless:
    """`head`, then characters without end, in chunks; counts what it gave."""

    def __init__(self, head: str):
        self.head = head
        self.given = 0

    def __iter__(self):
        yield self.head
        while True:
            self.given += 1000
            yield "a" * 1000


def test_output_past_the_records_a_sample_reads_is_cut_and_reported(tmp_path, monkeypatch):
    """Past MAX_RECORDS the tool is killed (it sleeps after them here: waiting for it would
    end in a timeout) and a `dropped` status says what was read."""
    monkeypatch.setattr(qp_module, "MAX_RECORDS", 10)
    records = ",".join(_record(n, 7 + n % 3) for n in range(1, 26))
    pid_file = tmp_path / "pid"
    _fake_rdma(
        tmp_path, monkeypatch, f"echo $$ > {pid_file}\nprintf '%s' '[{records}'\nexec sleep 60\n"
    )
    ctx = _ctx(tmp_path, recorder=_Rec())
    *qps, status = RdmaQpSensor().collect(ctx)
    assert [e["rdma.qp.lqpn"] for e in qps] == list(range(1, 11))
    assert (status["event.category"], status["event.action"]) == ("sensor_status", "dropped")
    assert status["message"] == (
        "QP output cut after 10 records (more than 10 records): the QPs after them are "
        "neither listed nor counted"
    )
    with pytest.raises(ProcessLookupError):
        os.kill(int(pid_file.read_text()), 0)  # killed and reaped
    # the recorder got what was read, whose replay reads the same ten records
    replayed = RdmaQpSensor().collect(_ctx(tmp_path, replay=dict(ctx.recorder.inputs)))
    assert replayed[:-1] == qps


def test_output_past_the_characters_a_sample_reads_is_cut_and_reported(monkeypatch):
    monkeypatch.setattr(qp_module, "MAX_OUTPUT_CHARS", 1000)
    text = "[" + ",".join(_record(n, 7) for n in range(1, 100)) + "]"
    sample = read_qps(text[i : i + 100] for i in range(0, len(text), 100))
    assert sample.cut == "more than 1000 characters"
    assert 0 < sample.records < 20


def test_a_sample_holds_what_it_lists_not_the_output(tmp_path, monkeypatch):
    """60,000 QPs of one process (12 MB of JSON) through the live path: the sample's Python
    memory at its peak stays far under the output's size (it held the output, then a dict
    per QP, then a QueuePair per QP: over 100 MB)."""
    output = tmp_path / "qps.json"
    with open(output, "w") as fh:
        fh.write("[")
        fh.write(",".join(_record(n, 41000, comm="python3") for n in range(60000)))
        fh.write("]\n")
    _fake_rdma(tmp_path, monkeypatch, f"cat {output}\n")
    tracemalloc.start()
    try:
        events = RdmaQpSensor().collect(_ctx(tmp_path))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(events) == 256
    assert events[-1]["rdma.qp.not_listed"] == 60000 - 256
    assert peak < 6 << 20, f"{peak / 1e6:.1f} MB"


# --- the tool ----------------------------------------------------------------------------------


class _Clock:
    """time.monotonic for rdma_output, moved on by the test."""

    def __init__(self):
        self.now = 1000.0

    def monotonic(self):
        return self.now


def test_the_time_spent_on_the_output_is_not_the_tools(tmp_path, monkeypatch):
    """The timeout bounds how long the tool keeps the sensor waiting: under the agent's CPU
    quota reading a large output takes longer than printing it, and that used to count."""
    _fake_rdma(tmp_path, monkeypatch, "printf '['\nsleep 0.3\nprintf ']'\n")
    clock = _Clock()
    monkeypatch.setattr(qp_module, "time", clock)
    text = ""
    for chunk in rdma_output(timeout_s=10):
        clock.now += 100  # the sensor's own time, between reads
        text += chunk
    assert text == "[]"


def test_a_tool_that_does_not_end_is_killed_at_the_timeout(tmp_path, monkeypatch):
    pid_file = tmp_path / "pid"
    _fake_rdma(tmp_path, monkeypatch, f"echo $$ > {pid_file}\nprintf '[{{'\nexec sleep 60\n")
    started = time.monotonic()
    # long enough for a loaded host to start the tool (its pid file is read below)
    with pytest.raises(TimeoutError, match=r"^`rdma -j res show qp` did not finish in 3 s$"):
        read_qps(rdma_output(timeout_s=3))
    assert time.monotonic() - started < 30  # not the tool's 60 s
    with pytest.raises(ProcessLookupError):
        os.kill(int(pid_file.read_text()), 0)


def test_a_tool_writing_much_on_stderr_does_not_block(tmp_path, monkeypatch):
    """stderr is read beside stdout: a full stderr pipe would block the tool for good."""
    _fake_rdma(
        tmp_path,
        monkeypatch,
        "head -c 300000 /dev/zero | tr '\\0' x >&2\necho >&2\necho 'the last line' >&2\n"
        "printf '[]'\nexit 2\n",
    )
    with pytest.raises(base.SensorUnavailable, match=r"failed: the last line$"):
        read_qps(rdma_output(timeout_s=20))


# --- recording ---------------------------------------------------------------------------------


def test_a_recorded_output_is_kept_up_to_its_cap(tmp_path, monkeypatch):
    """A snapshot keeps a streamed output up to RECORDED_STREAM_MAX characters: its replay
    then reads a cut output and says so."""
    text = "[" + ",".join(_record(n, 7) for n in range(1, 30)) + "]"
    (tmp_path / "out.json").write_text(text)
    _fake_rdma(tmp_path, monkeypatch, f"cat {tmp_path / 'out.json'}\n")
    recorder = _Rec()
    events = RdmaQpSensor().collect(_ctx(tmp_path, recorder=recorder))
    assert len(events) == 29
    assert recorder.inputs == {INPUT_NAME: text}
    monkeypatch.setattr(base, "RECORDED_STREAM_MAX", 100)
    recorder = _Rec()
    assert RdmaQpSensor().collect(_ctx(tmp_path, recorder=recorder)) == events
    assert recorder.inputs == {INPUT_NAME: text[:100]}
    with pytest.raises(QpOutputError, match=re.escape("(the output ends in record")):
        RdmaQpSensor().collect(_ctx(tmp_path, replay=recorder.inputs))


def test_a_failed_live_run_records_nothing(tmp_path, monkeypatch):
    _fake_rdma(tmp_path, monkeypatch, "printf '[]'\necho 'no netlink' >&2\nexit 1\n")
    recorder = _Rec()
    with pytest.raises(base.SensorUnavailable):
        RdmaQpSensor().collect(_ctx(tmp_path, recorder=recorder))
    assert recorder.inputs == {}


def test_replaying_a_streamed_input_never_runs_the_tool(tmp_path):
    def boom():
        raise AssertionError("live source used during replay")

    ctx = _ctx(tmp_path, replay={INPUT_NAME: "[]"})
    ctx.refused_inputs = {"other.json": "a FIFO"}
    assert list(ctx.raw_chunks(INPUT_NAME, boom) or ()) == ["[]"]
    assert ctx.raw_chunks("other.json", boom) is None
    assert ctx.take_refusals() == ["other.json: a FIFO"]

from hpcsec.sensors.base import FsRoot, SensorContext, SensorSpec, SensorUnavailable, run_sensor
from hpcsec.sensors.procinfo import PROCESS_STATUS_KEYS, Users, status_fields


class _Rec:
    def __init__(self):
        self.files, self.links, self.inputs = {}, {}, {}

    def record_file(self, root, rel, data):
        self.files[(root, rel)] = data

    def record_link(self, root, rel, target):
        self.links[(root, rel)] = target

    def record_input(self, name, data):
        self.inputs[name] = data


def _ctx(tmp_path, recorder=None, replay=None):
    return SensorContext(
        "n1",
        FsRoot("sys", tmp_path / "sys", recorder),
        FsRoot("proc", tmp_path / "proc", recorder),
        FsRoot("etc", tmp_path / "etc", recorder),
        timestamp="2026-11-30T00:00:00.000Z",
        recorder=recorder,
        replay_inputs=replay,
    )


def test_fsroot_reads_through_root_and_records(tmp_path):
    (tmp_path / "sys/class/x").mkdir(parents=True)
    (tmp_path / "sys/class/x/v").write_text("7\n")
    (tmp_path / "sys/class/x/l").symlink_to("v")
    rec = _Rec()
    ctx = _ctx(tmp_path, rec)
    assert ctx.sys.read_text("/class/x/v") == "7\n"
    assert ctx.sys.listdir("class/x") == ["l", "v"]
    assert ctx.sys.readlink("class/x/l") == "v"
    assert ctx.sys.read_text("class/x/missing") is None
    assert ctx.sys.listdir("class/missing") == []
    assert rec.files == {("sys", "/class/x/v"): b"7\n"}
    assert rec.links == {("sys", "class/x/l"): "v"}


def test_raw_input_live_records_and_replay_never_calls_live(tmp_path):
    rec = _Rec()
    live = _ctx(tmp_path, rec)
    assert live.raw_input("nvml.json", lambda: "{}") == "{}"
    assert rec.inputs == {"nvml.json": "{}"}
    replay = _ctx(tmp_path, replay={"nvml.json": "[1]"})

    def boom():
        raise AssertionError("live source used during replay")

    assert replay.raw_input("nvml.json", boom) == "[1]"
    assert replay.raw_input("rdma-res-qp.json", boom) is None


class _Absent:
    name = "absent"

    def collect(self, ctx):
        raise SensorUnavailable("no such hardware")


class _Broken:
    name = "broken"

    def collect(self, ctx):
        yield {"x": 1}
        raise ValueError("bad parse")


def test_run_sensor_turns_absence_and_failure_into_status(tmp_path):
    ctx = _ctx(tmp_path)
    absent = run_sensor(SensorSpec("absent", _Absent, "t"), _Absent(), ctx)
    assert absent.events == [] and absent.status["event.action"] == "unavailable"
    assert absent.status["message"] == "no such hardware"
    assert absent.status["event.category"] == "sensor_status"
    broken = run_sensor(SensorSpec("broken", _Broken, "t"), _Broken(), ctx)
    assert broken.status["event.action"] == "error"
    assert broken.status["message"] == "ValueError: bad parse"


def test_live_reads_stop_at_the_limit_and_refuse_what_is_not_a_file(tmp_path):
    """read_bytes on the live node reads a descriptor directly: at most `limit` bytes,
    whatever the file's size, across as many reads as the kernel makes; None for a
    directory or a missing file, and nothing recorded then."""
    (tmp_path / "proc/1").mkdir(parents=True)
    (tmp_path / "proc/1/big").write_bytes(b"x" * 300_000)
    (tmp_path / "proc/1/small").write_bytes(b"Name:\tbash\n")
    rec = _Rec()
    proc = _ctx(tmp_path, rec).proc
    assert proc.read_bytes("1/big", 100) == b"x" * 100
    assert proc.read_bytes("1/big", 1 << 20) == b"x" * 300_000
    assert proc.read_bytes("/1/small") == b"Name:\tbash\n"
    assert proc.read_bytes("1") is None and proc.read_bytes("1/gone") is None
    assert rec.files == {("proc", "1/big"): b"x" * 300_000, ("proc", "/1/small"): b"Name:\tbash\n"}
    assert proc.full_path("") == str(tmp_path / "proc")
    assert proc.full_path("/1/small") == str(tmp_path / "proc/1/small")
    proc.path = tmp_path / "elsewhere"  # tests point a context's roots at other trees
    assert (
        proc.full_path("1") == str(tmp_path / "elsewhere/1") and proc.read_bytes("1/small") is None
    )


def test_status_fields_can_stop_at_the_keys_asked_for():
    text = "Name:\tbash\nUmask:\t0022\nPPid:\t1\nUid:\t1000\t1000\t1000\t1000\nGid:\t100\n"
    assert status_fields(text) == {
        "Name": "bash",
        "Umask": "0022",
        "PPid": "1",
        "Uid": "1000\t1000\t1000\t1000",
        "Gid": "100",
    }
    assert status_fields(text, PROCESS_STATUS_KEYS) == {
        "Name": "bash",
        "PPid": "1",
        "Uid": "1000\t1000\t1000\t1000",
    }
    assert status_fields("Name:\tx\n", PROCESS_STATUS_KEYS) == {"Name": "x"}  # absent: absent


def test_status_and_passwd_lines_end_at_newlines_only():
    """The status Name line is the process's own comm and a GECOS is its user's to set: the
    kernel and chfn keep `\\n` out, not `\\r` (where str.splitlines also breaks)."""
    text = "Name:\t\rUid:\t0\rPPid:\t1\nPPid:\t4242\nUid:\t1001\t1001\t1001\t1001\n"
    values = status_fields(text, PROCESS_STATUS_KEYS)
    assert (values["PPid"], values["Uid"].split()[0]) == ("4242", "1001")
    users = Users.parse("root:x:0:0:root:/root:/bin/sh\nalice:x:1001:100:A\rbob:x:7:7::/:\n")
    assert (users.name(1001), users.name(7)) == ("alice", None)

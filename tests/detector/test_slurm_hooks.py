import json
import os
from dataclasses import replace
from pathlib import Path

from hpcsec.detector.cli import main as cli
from hpcsec.detector.cli import slurm as hook_cli
from hpcsec.detector.slurm import hooks
from hpcsec.detector.slurm.jobs import SlurmCommands, SlurmUnreachable
from tests.fakes.nvml import FakeNvml, h100_node, installed

ENV = {
    "SLURM_JOB_ID": "5",
    "SLURM_JOB_UID": "1001",
    "SLURM_JOB_USER": "alice",
    "SLURM_JOB_GPUS": "0,1",
    "SLURM_JOB_ACCOUNT": "llm-core",
    "SLURM_JOB_PARTITION": "gpu",
}


class Listpids(SlurmCommands):
    def __init__(self, text: str | None):
        object.__setattr__(self, "text", text)

    def listpids(self) -> str:
        if self.text is None:
            raise SlurmUnreachable("scontrol listpids timed out after 2s")
        return self.text


def args_for(tmp_path: Path, hook: str, nvml_json: str | None = None) -> hooks.HookSettings:
    return hooks.HookSettings(
        hook=hook,
        state_dir=str(tmp_path / "state"),
        procfs_root=str(tmp_path / "proc"),
        etc_root=str(tmp_path / "etc"),
        host_name="gpu017",
        nvml_json=nvml_json,
        slurm_timeout=2.0,
    )


def make_proc(
    tmp_path: Path,
    pid: int,
    uid: int,
    comm: str = "sleep",
    state: str = "S",
    cgroup: str = "0::/\n",
    environ: bytes = b"",
) -> None:
    d = tmp_path / "proc" / str(pid)
    d.mkdir(parents=True)
    (d / "status").write_text(
        f"Name:\t{comm}\nState:\t{state} (x)\nPPid:\t1\nUid:\t{uid}\t{uid}\t{uid}\t{uid}\n"
    )
    (d / "comm").write_text(comm + "\n")
    (d / "cmdline").write_bytes(comm.encode() + b"\x00171\x00")
    (d / "cgroup").write_text(cgroup)
    (d / "environ").write_bytes(environ)


def events(tmp_path: Path) -> list[dict]:
    text = (tmp_path / "state" / hooks.HOOK_EVENTS_FILE).read_text()
    return [json.loads(line) for line in text.splitlines()]


def idle(fake: FakeNvml) -> FakeNvml:
    gpus = [replace(g, compute=(), graphics=(), mps=(), memory_used=568852480) for g in fake.gpus]
    return replace(fake, gpus=gpus)


def setup_node(tmp_path: Path) -> None:
    (tmp_path / "etc").mkdir()
    (tmp_path / "etc" / "passwd").write_text(
        "alice:x:1001:1001::/home/alice:/bin/bash\nbob:x:1002:1002::/home/bob:/bin/bash\n"
    )
    make_proc(tmp_path, 100, 1001, cgroup="4:memory:/slurm/uid_1001/job_9/step_0\n")
    make_proc(tmp_path, 101, 1001, environ=b"SLURM_JOB_ID=5\0")  # escaped the job
    make_proc(tmp_path, 102, 1001, state="Z")
    make_proc(tmp_path, 103, 1002)
    make_proc(tmp_path, 104, 1001)  # in alice's job 9, known to slurmd (linuxproc)
    (tmp_path / "proc" / "self").mkdir()


def test_prolog_then_epilog_with_findings(tmp_path):
    setup_node(tmp_path)
    with installed(idle(h100_node())):
        hooks.Hook(args_for(tmp_path, "prolog"), ENV, Listpids("")).prolog()
    state = json.loads((tmp_path / "state" / "jobs" / "5.json").read_text())
    assert (state["gpus"], state["gpu_memory_used"]) == ([0, 1], {"0": 568852480, "1": 568852480})
    with installed(h100_node()):  # the job's processes still hold GPUs 0 and 1
        hooks.Hook(
            args_for(tmp_path, "epilog"), ENV, Listpids("PID JOBID STEPID\n104 9 batch\n")
        ).epilog()
    prolog, epilog, *findings = events(tmp_path)
    assert (prolog["event.action"], prolog["hpcsec.sensor"], prolog["host.name"]) == (
        "prolog",
        "slurm_prolog",
        "gpu017",
    )
    assert {k: v for k, v in prolog.items() if k.startswith("slurm.")} == {
        "slurm.job.id": "5",
        "slurm.job.user": "alice",
        "slurm.job.account": "llm-core",
        "slurm.job.partition": "gpu",
        "slurm.job.gpus": [0, 1],
        "slurm.job.id_source": "slurmd",
        "slurm.job.state": "RUNNING",
        "slurm.job.start": prolog["@timestamp"],
    }
    assert epilog["event.action"] == "epilog"
    assert epilog["slurm.job.start"] == prolog["slurm.job.start"]
    assert "hpcsec.findings" not in epilog
    assert epilog["message"] == (
        "5 findings: gpu_memory_not_released, gpu_process_after_job, lingering_process"
    )
    assert [
        (f["event.action"], f["hpcsec.findings"], f.get("process.pid"), f.get("gpu.index"))
        for f in findings
    ] == [
        ("epilog_findings", ["lingering_process"], 101, None),
        ("epilog_findings", ["gpu_process_after_job"], 41000, 0),
        ("epilog_findings", ["gpu_memory_not_released"], None, 0),
        ("epilog_findings", ["gpu_process_after_job"], 41001, 1),
        ("epilog_findings", ["gpu_memory_not_released"], None, 1),
    ]
    lingering = findings[0]
    assert (
        lingering["user.name"],
        lingering["process.name"],
        lingering["process.command_line"],
        lingering["process.env.SLURM_JOB_ID"],
    ) == ("alice", "sleep", "sleep 171", "5")
    assert lingering["message"] == (
        "process 101 (sleep) of alice still running after job 5 and in no other job on this node"
    )
    # 62 GiB now, 568852480 bytes at the prolog
    assert findings[2]["message"] == "GPU 0 holds 66003140608 bytes more than before job 5"
    assert findings[1]["gpu.uuid"] == "GPU-3a4b5c6d-0e1f-4a2b-8c3d-4e5f6a7b8c90"
    assert not (tmp_path / "state" / "jobs" / "5.json").exists()


def test_epilog_without_nvml_or_slurm_still_reports(tmp_path, capsys):
    setup_node(tmp_path)
    with installed(FakeNvml([], library_missing=True)):
        hooks.Hook(args_for(tmp_path, "epilog"), ENV, Listpids(None)).epilog()
    [epilog, finding, finding2] = events(tmp_path)
    # without listpids, pid 104 of the other job cannot be told apart: reported too
    assert [finding["process.pid"], finding2["process.pid"]] == [101, 104]
    assert "slurm.job.start" not in epilog  # no prolog record
    err = capsys.readouterr().err
    assert "hpcsec slurm epilog: scontrol listpids timed out after 2s" in err
    assert "hpcsec slurm epilog: GPU checks skipped: NVML library not found" in err


def test_gpu_state_from_a_dump(tmp_path):
    setup_node(tmp_path)
    dump = tmp_path / "nvml.json"
    dump.write_text(
        json.dumps(
            {
                "devices": [
                    {
                        "index": 1,
                        "uuid": "GPU-x",
                        "memory_used_bytes": 1,
                        "processes": [{"pid": 777, "type": "compute", "used_gpu_memory_bytes": 5}],
                    },
                    {
                        "index": 2,
                        "uuid": "GPU-y",
                        "memory_used_bytes": 1,
                        "processes": [{"pid": 778, "type": "compute", "used_gpu_memory_bytes": 5}],
                    },
                ]
            }
        )
    )
    env = {**ENV, "SLURM_JOB_UID": "0"}  # root's job: no lingering-process check
    hooks.Hook(args_for(tmp_path, "epilog", str(dump)), env, Listpids("")).epilog()
    [_, finding] = events(tmp_path)
    assert (finding["process.pid"], finding["gpu.index"], finding["gpu.memory_used_bytes"]) == (
        777,
        1,
        5,
    )


def test_always_exit_zero(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    assert cli.main(["slurm", "prolog", "--state-dir", str(tmp_path)]) == 0
    assert capsys.readouterr().err == (
        "hpcsec slurm prolog: SLURM_JOB_ID is not set: not run by slurmd?\n"
    )
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv("SLURM_JOB_ID", "12")
    assert (
        hook_cli.main(["epilog", "--state-dir", str(blocker / "sub"), "--slurm-timeout", "0.5"])
        == 0
    )
    assert "hpcsec slurm epilog: cannot create directory" in capsys.readouterr().err
    assert hook_cli.main(["nonsense"]) == 0


def test_an_internal_error_is_logged_with_its_traceback_and_still_exits_zero(
    tmp_path, monkeypatch, capsys
):
    def bug(self):  # a bug in the hook: what the log must show is where it happened
        raise RuntimeError("boom")

    monkeypatch.setattr(hooks.Hook, "prolog", bug)
    monkeypatch.setenv("SLURM_JOB_ID", "12")
    assert hook_cli.main(["prolog", "--state-dir", str(tmp_path)]) == 0
    err = capsys.readouterr().err
    assert "hpcsec: ERROR: slurm prolog: internal error: RuntimeError: boom" in err
    assert "Traceback (most recent call last)" in err and "in bug" in err


def test_epilog_findings_survive_a_process_with_a_hostile_name(tmp_path):
    setup_node(tmp_path)
    make_proc(tmp_path, 105, 1001)  # a second lingering process of alice's, named in bytes
    d = tmp_path / "proc" / "105"
    (d / "comm").write_bytes(b"\xffsl\n")
    (d / "cmdline").write_bytes(b"./\xffsl\0")
    os.symlink(b"/tmp/\xffsl", os.fsencode(d / "exe"))
    with installed(idle(h100_node())):
        hooks.Hook(args_for(tmp_path, "epilog"), ENV, Listpids("")).epilog()
    findings = [e for e in events(tmp_path) if e["event.action"] == "epilog_findings"]
    lingering = {e["process.pid"]: e for e in findings if "process.pid" in e}
    assert {101, 104, 105} <= set(lingering)
    assert lingering[105]["process.executable"] == "/tmp/\\xffsl"
    assert lingering[105]["process.name"] == "\\xffsl"


def test_without_host_name_the_events_carry_the_short_host_name(tmp_path):
    import socket

    settings = replace(args_for(tmp_path, "prolog"), host_name=None)
    hooks.Hook(settings, {**ENV, "SLURM_JOB_GPUS": ""}, Listpids("")).prolog()
    (prolog,) = events(tmp_path)
    assert prolog["host.name"] == socket.gethostname().split(".")[0]


def test_the_epilog_builds_its_slurm_commands_from_the_timeout(tmp_path):
    hook = hooks.Hook(replace(args_for(tmp_path, "epilog"), slurm_timeout=0.5), ENV)
    assert hook.commands == SlurmCommands(0.5) and hook.commands is hook.commands

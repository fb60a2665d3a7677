"""Attack scenarios on the node itself: firmware drift and multi-tenant isolation escapes.

Same conventions as scenario_attacks.py, which collects these into ATTACKS.
"""

from __future__ import annotations

from scenario_common import ATTACK_T0, NODE, alert, at, epilog_finding, node_sample
from snapshot_model import FileAccess, GpuProc, Job, Proc, Sample, Scenario

BOB_JOB = Job(
    4260,
    "bob",
    "vision",
    "gpu-017",
    "gpu:2(IDX:4-5)",
    name="vit-eval",
    start="2026-11-30T00:30:00Z",
)
MALLORY_JOB = Job(
    4250, "mallory", "students", "gpu-017", "gpu:1(IDX:6)", name="hw3", start="2026-11-30T00:40:00Z"
)


def times(n: int) -> list[str]:
    return [at(ATTACK_T0, 10 * i) for i in range(n)]


def scenario(name: str, summary: str, samples: list[Sample], expected: list) -> Scenario:
    return Scenario(name, summary, NODE, samples, expected)


# ------------------------------------------------------------------------ firmware_drift


def firmware_vulnerable_hca() -> Scenario:
    samples = [node_sample(t, hca_fw={"mlx5_2": "28.33.2028"}) for t in times(2)]
    return scenario(
        "firmware_drift-vulnerable-hca",
        "mlx5_2 runs HCA firmware 28.33.2028: off baseline and on the known-vulnerable list",
        samples,
        [
            alert(
                "2d6643a2-3a1b-4dc9-b37a-8ae98c1d0ce1", "Firmware differs from the golden baseline"
            ),
            alert(
                "34d03740-1969-41cf-adbc-7ecec0a1af84",
                "Firmware version on the site's known-vulnerable list",
            ),
        ],
    )


def firmware_flashed_by_user() -> Scenario:
    """bob flashes mlx5_0 from inside his job; the version changes at the next sample."""
    flint = Proc(
        63000,
        "bob",
        ["/usr/bin/mstflint", "-d", "0000:1b:00.0", "-i", "/home/bob/fw-custom.bin", "-y", "burn"],
        job=4260,
    )
    t = times(3)
    samples = [
        node_sample(t[0], jobs=[BOB_JOB]),
        node_sample(t[1], jobs=[BOB_JOB], procs=[flint]),
        node_sample(t[2], jobs=[BOB_JOB], hca_fw={"mlx5_0": "28.39.9999"}),
    ]
    return scenario(
        "firmware_drift-flashed-by-user",
        "bob runs mstflint inside job 4260 and "
        "the firmware of mlx5_0 changes outside any maintenance window",
        samples,
        [
            alert(
                "7bde829e-9a4c-4a55-b558-b5728fff32e0",
                "Firmware flashing tool run by a non-admin or inside a job",
                job="4260",
                user="bob",
            ),
            alert(
                "b0e9a4b6-b97f-40c4-8351-8705bfde1d9c",
                "Firmware version changed since the previous scan",
            ),
            alert(
                "40188d5e-dbb4-496b-8d22-f5e347c5dc5e",
                "Firmware flashed outside a maintenance window",
            ),
        ],
    )


def firmware_vbios_changed() -> Scenario:
    """GPU 3's VBIOS changes between two scans with no maintenance declared."""
    t = times(2)
    samples = [node_sample(t[0]), node_sample(t[1], vbios={3: "96.00.99.00.07"})]
    return scenario(
        "firmware_drift-vbios-changed",
        "the VBIOS of GPU 3 changes between two samples outside maintenance",
        samples,
        [
            alert(
                "b0e9a4b6-b97f-40c4-8351-8705bfde1d9c",
                "Firmware version changed since the previous scan",
            ),
            alert(
                "2d6643a2-3a1b-4dc9-b37a-8ae98c1d0ce1", "Firmware differs from the golden baseline"
            ),
        ],
    )


# ------------------------------------------------------------------------ isolation_escape


def isolation_shared_gpu() -> Scenario:
    """mallory's job (GPU 6) also runs on GPU 0, which alice's job uses: no MIG."""
    snoop = Proc(65000, "mallory", ["/usr/bin/python3", "snoop.py", "--device", "0"], job=4250)
    samples = [
        node_sample(t, procs=[snoop], jobs=[MALLORY_JOB], gpu_procs=[GpuProc(0, 65000, 1 << 30)])
        for t in times(2)
    ]
    return scenario(
        "isolation_escape-shared-gpu",
        "mallory's process shares GPU 0 with alice's training rank; the GPU has no MIG",
        samples,
        [
            alert(
                "5b887c0d-a460-449f-8ed2-ac861847b0a6",
                "Two users' processes on one GPU without MIG",
            ),
            alert(
                "9544d1e5-55bb-4e73-8fe3-dc7ac49a0586",
                "Job process on a GPU outside its allocation",
                job="4250",
                user="mallory",
                gpu=0,
            ),
        ],
    )


def isolation_munge_key() -> Scenario:
    """A root shell (escalated by mallory) copies the munge key."""
    cat = Proc(64100, "root", ["cat", "/etc/munge/munge.key"], ppid=64090)
    samples = [
        node_sample(
            t,
            procs=[cat],
            files=[FileAccess(64100, "/etc/munge/munge.key", ["open", "read"], size=1024)]
            if i
            else [],
        )
        for i, t in enumerate(times(2))
    ]
    return scenario(
        "isolation_escape-munge-key",
        "a root shell reads /etc/munge/munge.key with cat",
        samples,
        [
            alert(
                "926ff8b4-dbdd-4d0b-960a-78c51984278a",
                "munge.key accessed by anything but munged",
                user="root",
            )
        ],
    )


def isolation_slurm_config() -> Scenario:
    """A root shell adds a SPANK plugin to plugstack.conf and reads slurmdbd.conf."""
    editor = Proc(
        64200,
        "root",
        ["sed", "-i", "$a required /tmp/.s/spank_x.so", "/etc/slurm/plugstack.conf"],
        ppid=64090,
    )
    reader = Proc(64201, "root", ["cat", "/etc/slurm/slurmdbd.conf"], ppid=64090)
    files = [
        FileAccess(64200, "/etc/slurm/plugstack.conf", ["open", "write", "close_write"]),
        FileAccess(64201, "/etc/slurm/slurmdbd.conf", ["open", "read"]),
    ]
    samples = [
        node_sample(t, procs=[editor, reader], files=files if i else [])
        for i, t in enumerate(times(2))
    ]
    return scenario(
        "isolation_escape-slurm-config",
        "a root shell plants a SPANK plugin in "
        "plugstack.conf and reads the accounting database password",
        samples,
        [
            alert(
                "c940f65d-5c59-4d1b-9fa9-aded3972dcce",
                "Slurm configuration or secrets touched by anything but the Slurm daemons",
                user="root",
            )
        ],
    )


def isolation_ld_preload() -> Scenario:
    """alice's rank 1 runs with a preloaded CUDA hook dropped by a malicious package."""
    samples = []
    for t in times(2):
        sample = node_sample(t)
        for proc in sample.procs:
            if proc.pid == 41001:
                proc.env["LD_PRELOAD"] = "/home/alice/.cache/pip/.hooks/libcudahook.so"
        samples.append(sample)
    return scenario(
        "isolation_escape-ld-preload",
        "a GPU rank of alice's job 4242 runs with LD_PRELOAD pointing at an unknown CUDA hook",
        samples,
        [
            alert(
                "72377c41-beb2-4055-9a89-cbaab0a7bcc1",
                "LD_PRELOAD set in a job's GPU process",
                job="4242",
                user="alice",
            )
        ],
    )


def isolation_leftovers_and_ecc() -> Scenario:
    """bob's finished job left a process; ECC is off on GPU 5; mallory has a shell."""
    ended = Job(
        4199,
        "bob",
        "vision",
        "gpu-017",
        "gpu:1(IDX:5)",
        name="sweep",
        state="COMPLETED",
        start="2026-11-30T00:00:00Z",
        end="2026-11-30T00:59:30Z",
    )
    leftover = Proc(51500, "bob", ["/usr/bin/python3", "sweep_worker.py"], job=4199)
    shell = Proc(64500, "mallory", ["-bash"], comm="bash")
    t = times(2)
    samples = [
        node_sample(
            t[0],
            jobs=[ended],
            procs=[leftover, shell],
            ecc_off=(5,),
            slurm_events=[epilog_finding(t[0], ended, 51500, "python3")],
        ),
        node_sample(t[1], jobs=[ended], procs=[leftover, shell], ecc_off=(5,)),
    ]
    return scenario(
        "isolation_escape-leftovers-and-ecc",
        "a process of bob's ended job 4199 "
        "survives the epilog, GPU 5 runs with ECC off, and mallory has a shell "
        "without a job",
        samples,
        [
            alert(
                "7436c9e5-ce89-4cfb-a138-f9d418f72c69",
                "Processes left behind after the job ended",
                job="4199",
                user="bob",
            ),
            alert(
                "dbfac5cc-10bb-42f3-8622-fa64de82ef61",
                "Process still running in a job that has ended",
                job="4199",
                user="bob",
            ),
            alert("494c85a1-d78e-43c8-9518-d117a318f4cd", "GPU with ECC disabled", gpu=5),
            alert(
                "9dba2bf4-de8f-4cf6-9a79-ce4e0b5e5454",
                "Process of a regular user outside any Slurm job",
                user="mallory",
            ),
        ],
    )

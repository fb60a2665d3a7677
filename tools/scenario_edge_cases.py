"""Attack and benign pairs for the cases where an alert could say the wrong thing: events that
arrive out of event-time order, Slurm down, a dataset's declared writer at work, and services
found by their listening port.

An attack scenario is named after its vector (or `self_health-…`) and lists the alerts it must
raise; with `exclusive` no other rule may fire. A benign scenario is named `benign-…` and must
raise nothing. Same conventions as scenario_attacks.py otherwise.
"""

from __future__ import annotations

from scenario_common import NODE, PEER, alert, dataloader_reads, node_sample
from scenario_node_attacks import BOB_JOB, scenario, times
from snapshot_model import FileAccess, Job, Proc, Sample, Scenario, Sock

DROP = ("198.51.100.23", 443)  # an attacker's object store (TEST-NET-2 address)
LLAMA70 = "/lustre/models/llama-70b/model-00001-of-00030.safetensors"
C4 = "/lustre/datasets/c4/en"
# the dataset's declared writer (site config: c4 writers {users: [svc-data]}), in its own job
INGEST_JOB = Job(
    4270,
    "svc-data",
    "data-eng",
    "gpu-017",
    "gpu:1(IDX:7)",
    name="c4-ingest",
    start="2026-11-30T00:50:00Z",
)


def exclusive(s: Scenario) -> Scenario:
    s.exclusive = True
    return s


# ------------------------------------------------------------------ out-of-order arrival


def model_read_then_exfil_out_of_order() -> Scenario:
    """One sample: the sockets sensor lists the upload's connection (01:00:10) before the file
    events list the weights read it follows (01:00:05)."""
    t = times(2)
    uploader = Proc(61300, "alice", ["/usr/bin/python3", "push.py"], job=4242)
    read = FileAccess(61300, LLAMA70, ["open", "read"], count=300, at="2026-11-30T01:00:05Z")
    samples = [
        node_sample(t[0], procs=[uploader]),
        node_sample(
            t[1],
            procs=[uploader],
            sockets=[Sock(61300, (NODE.ip, 53010), DROP)],
            files=[read],
        ),
    ]
    return scenario(
        "model_theft-out-of-order-exfiltration",
        "alice's job reads llama-70b weights at 01:00:05 and connects out of the cluster at "
        "01:00:10; the snapshot lists the connection before the read",
        samples,
        [
            alert(
                "29a01723-7079-494a-a963-9f1f09050a8b",
                "Model weights read, then a connection out of the cluster",
            )
        ],
    )


def benign_connect_then_read() -> Scenario:
    """The reverse by event time: a job fetches code from outside (01:00:00), the connection
    ends, then it loads the weights (01:00:05): no read precedes the connection."""
    t = times(2)
    loader = Proc(61400, "alice", ["/usr/bin/python3", "finetune.py"], job=4242)
    samples = [
        node_sample(t[0], procs=[loader], sockets=[Sock(61400, (NODE.ip, 53020), DROP)]),
        node_sample(
            t[1],
            procs=[loader],
            sockets=[Sock(61400, (NODE.ip, 53021), (PEER, 29500))],  # its job's other node
            files=[
                FileAccess(61400, LLAMA70, ["open", "read"], count=300, at="2026-11-30T01:00:05Z")
            ],
        ),
    ]
    return scenario(
        "benign-connect-then-read-weights",
        "alice's job connects out, then reads llama-70b weights and talks only to its "
        "job's other node: the reverse order of an exfiltration",
        samples,
        [],
    )


# ------------------------------------------------------------------ Slurm down


def slurm_down() -> Scenario:
    """Slurm stops answering after the first sample: alice's job processes and bob's login
    shell (from then on) are of regular users, neither in nor outside a job as far as anyone
    knows."""
    shell = Proc(52100, "bob", ["-bash"], comm="bash")
    samples = [
        node_sample(t, procs=[shell] if i else [], slurm_down=i > 0) for i, t in enumerate(times(3))
    ]
    return exclusive(
        scenario(
            "self_health-slurm-down",
            "Slurm stops answering while alice's job trains and bob is logged in: one "
            "self-health alert, no process reported as outside a job",
            samples,
            [
                alert(
                    "ddc813dc-8462-4621-abea-3cf9112ca1aa",
                    "Slurm unreachable from the node",
                )
            ],
        )
    )


# ------------------------------------------------------------------ declared writers


def _new_shards(pid: int, first: int, n: int) -> list[FileAccess]:
    return [
        FileAccess(
            pid,
            f"{C4}/c4-train.{k:05d}-of-01024.json.gz",
            ["create", "write", "close_write"],
            size=318_767_104,
        )
        for k in range(first, first + n)
    ]


def _writer_samples(writer: Proc, jobs: list[Job]) -> list[Sample]:
    """alice's job reads shards 0-11 while `writer` adds shards 512-535, 12 a sample."""
    samples = []
    for i, t in enumerate(times(3)):
        files = dataloader_reads(41000, 4 * i)
        if i:
            files += _new_shards(writer.pid, 512 + 12 * (i - 1), 12)
        samples.append(node_sample(t, procs=[writer], jobs=jobs, files=files))
    return samples


def benign_declared_writer_ingest() -> Scenario:
    ingest = Proc(62400, "svc-data", ["/usr/bin/python3", "/opt/ingest/add_shards.py"], job=4270)
    return scenario(
        "benign-declared-writer-ingest",
        "the c4 publisher's ingest job adds 24 new shards while alice's job reads others",
        _writer_samples(ingest, [INGEST_JOB]),
        [],
    )


def poison_burst_by_other_user() -> Scenario:
    intruder = Proc(62500, "bob", ["/usr/bin/python3", "add_shards.py"], job=4260)
    return scenario(
        "data_poisoning-burst-by-other-user",
        "bob's job adds 24 shards to c4, which only svc-data publishes, while alice's job reads it",
        _writer_samples(intruder, [BOB_JOB]),
        [
            alert(
                "ba2cd488-f3c1-4bca-b347-8fa705e7f55b",
                "Burst of modifications to a protected dataset",
            ),
            alert(
                "002b7b30-aff2-42bd-bdc4-f1ceeca24e61",
                "Read-only dataset modified by a non-publisher",
                job="4260",
                user="bob",
            ),
        ],
    )


# ------------------------------------------------------------------ services by port


def _notebook(address: str) -> list[Sample]:
    lab = Proc(
        42200, "bob", ["/usr/bin/python3", "-m", "jupyter", "lab", f"--ip={address}"], job=4260
    )
    server = Proc(42300, "bob", ["/usr/bin/python3", "serve.py", "--model", "m"], job=4260)
    extra = dict(
        procs=[lab, server],
        jobs=[BOB_JOB],
        sockets=[
            Sock(42200, (address, 8888), state="LISTEN"),
            Sock(42300, (address, 8000), state="LISTEN"),  # vLLM's port, a bland command
        ],
    )
    return [node_sample(t, **extra) for t in times(2)]


def gpu_services_by_port() -> Scenario:
    return exclusive(
        scenario(
            "gpu_hijack-services-by-port",
            "bob's job runs `python -m jupyter` on 0.0.0.0:8888 and a model server started as "
            "`python3 serve.py` on 0.0.0.0:8000",
            _notebook("0.0.0.0"),
            [
                alert(
                    "b6bd43b5-dda7-4aab-96a4-57ddfde69cec",
                    "Inference, notebook or Ray service listening on a compute node",
                    job="4260",
                    user="bob",
                )
            ],
        )
    )


def benign_services_on_loopback() -> Scenario:
    return scenario(
        "benign-services-on-loopback",
        "the same notebook and model server of bob's job listen on 127.0.0.1 only "
        "(reached through an SSH tunnel)",
        _notebook("127.0.0.1"),
        [],
    )


EDGE_CASES = (
    model_read_then_exfil_out_of_order,
    benign_connect_then_read,
    slurm_down,
    benign_declared_writer_ingest,
    poison_burst_by_other_user,
    gpu_services_by_port,
    benign_services_on_loopback,
)

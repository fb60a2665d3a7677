"""Cross-event enrichment: users on each GPU, RoCE/socket peers inside or outside the job."""

import json

from hpcsec.detector.config.site import Principals, SiteConfig
from hpcsec.detector.enrich.enricher import Enricher, fill_gpu_users
from hpcsec.detector.enrich.slurm_job import mark_job_peers, mark_node_jobs
from hpcsec.detector.enrich.view import capture_view, host_addresses
from hpcsec.sensors.base import FsRoot, SensorContext

SQUEUE = {
    "jobs": [
        {
            "job_id": 77,
            "user_name": "alice",
            "user_id": 1001,
            "account": "llm-core",
            "partition": "gpu",
            "nodes": "gpu-[017-018]",
            "job_state": "RUNNING",
            "start_time": 1795000000,
            "name": "train",
            "gres_detail": ["gpu:2(IDX:0-1)"],
        }
    ]
}


def _ctx(tmp_path, jobs=SQUEUE):
    (tmp_path / "etc").mkdir(exist_ok=True)
    (tmp_path / "etc/hosts").write_text(
        "127.0.0.1 localhost\n10.0.0.17 gpu-017.cluster gpu-017\n"
        "10.0.0.18 gpu-018  # peer\n10.0.0.99 storage-1\nnot-an-ip bogus\n"
    )
    return SensorContext(
        "gpu-017",
        FsRoot("sys", tmp_path / "sys"),
        FsRoot("proc", tmp_path / "proc"),
        FsRoot("etc", tmp_path / "etc"),
        timestamp="2026-11-30T01:00:00.000Z",
        replay_inputs={"slurm-jobs.json": json.dumps(jobs)},
    )


def _flow(dest, **extra):
    return {
        "event.category": "roce_flow",
        "host.name": "gpu-017",
        "source.ip": "10.0.0.17",
        "destination.ip": dest,
        **extra,
    }


def test_hosts_file_is_read_through_the_etc_root(tmp_path):
    table = host_addresses(_ctx(tmp_path).etc)
    assert table["gpu-017"] == {"10.0.0.17"}
    assert table["gpu-018"] == {"10.0.0.18"}
    assert "bogus" not in table


def test_flows_to_job_nodes_and_elsewhere(tmp_path):
    events = [
        _flow("10.0.0.18"),
        _flow("10.0.0.99"),
        _flow("127.0.0.1"),
        {
            "event.category": "network_socket",
            "destination.ip": "10.0.0.99",
            "slurm.job.nodes": ["gpu-099"],
        },
        {"event.category": "network_socket", "destination.ip": "0.0.0.0"},
    ]
    mark_job_peers(events, capture_view(_ctx(tmp_path), events))
    assert [e.get("destination.is_job_node") for e in events] == [True, False, None, False, None]


def test_no_job_on_the_node_means_no_job_peers(tmp_path):
    events = [_flow("10.0.0.18")]
    mark_job_peers(events, capture_view(_ctx(tmp_path, jobs={"jobs": []}), events))
    assert events[0]["destination.is_job_node"] is False


def test_gpu_users_come_from_the_gpu_processes():
    events = [
        {
            "event.category": "gpu_device",
            "host.name": "n",
            "gpu.uuid": "GPU-a",
            "gpu.process_users": [],
        },
        {
            "event.category": "gpu_device",
            "host.name": "n",
            "gpu.uuid": "GPU-b",
            "gpu.process_users": [],
        },
        {
            "event.category": "gpu_process",
            "host.name": "n",
            "gpu.uuid": "GPU-a",
            "user.name": "alice",
        },
        {
            "event.category": "gpu_process",
            "host.name": "n",
            "gpu.uuid": "GPU-a",
            "user.name": "bob",
        },
        {
            "event.category": "gpu_process",
            "host.name": "n",
            "gpu.uuid": "GPU-a",
            "user.name": "alice",
        },
    ]
    fill_gpu_users(events)
    assert events[0]["gpu.process_users"] == ["alice", "bob"]
    assert events[0]["gpu.process_user_count"] == 2
    assert events[1]["gpu.process_users"] == [] and events[1]["gpu.process_user_count"] == 0


def test_enricher_runs_job_then_policy(tmp_path):
    config = SiteConfig(admins=Principals(users=("adm-carol",)))
    events = [
        {
            "event.category": "process",
            "host.name": "gpu-017",
            "user.name": "adm-carol",
            "@timestamp": "2026-11-30T01:00:00.000Z",
        }
    ]
    out = Enricher(config).enrich(events, capture_view(_ctx(tmp_path), events))
    assert out[0]["user.is_admin"] is True
    assert out[0]["hpcsec.in_maintenance"] is False


def test_without_a_job_list_peers_and_job_counts_stay_undecided(tmp_path):
    ctx = _ctx(tmp_path)
    ctx.replay_inputs = {}  # a sample recorded while Slurm did not answer
    flow = _flow("10.0.0.18")
    counters = {"event.category": "rdma_counters", "host.name": "gpu-017"}
    job_socket = {
        "event.category": "network_socket",
        "destination.ip": "10.0.0.18",
        "slurm.job.id": "77",
    }  # job id from the cgroup, no details
    mark_job_peers([flow, job_socket], capture_view(ctx, [flow, job_socket]))
    assert "destination.is_job_node" not in flow
    assert "destination.is_job_node" not in job_socket
    mark_node_jobs([counters], capture_view(ctx, [counters]))
    assert "slurm.node.job_count" not in counters
    # the node's processes still show a running job: the count is at least that
    mark_node_jobs([counters, job_socket], capture_view(ctx, [counters, job_socket]))
    assert counters["slurm.node.job_count"] == 1


def test_job_count_unites_the_list_and_the_jobs_seen(tmp_path):
    counters = {"event.category": "rdma_counters", "host.name": "gpu-017"}
    other = {"event.category": "process", "slurm.job.id": "99"}
    events = [counters, other]
    mark_node_jobs(events, capture_view(_ctx(tmp_path), events))
    assert counters["slurm.node.job_count"] == 2  # job 77 from squeue, 99 from a cgroup

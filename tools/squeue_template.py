"""The shape of one job of `squeue --json` as Slurm 22.05.8 prints it (openapi v0.0.38).

Captured from a real 22.05.8 cluster (`squeue --json`), with the fields a scenario sets
replaced by `squeue_job`; keeping every key lets the Slurm parser meet the real document.
"""

from __future__ import annotations

import copy
from typing import Any

from hpcsec.detector.core.hostlist import expand

JOB_22_05: dict[str, Any] = {
    "account": "",
    "accrue_time": 1796002351,
    "admin_comment": "",
    "array_job_id": 0,
    "array_task_id": None,
    "array_max_tasks": 0,
    "array_task_string": "",
    "association_id": 0,
    "batch_features": "",
    "batch_flag": True,
    "batch_host": "vm",
    "flags": ["JOB_WAS_RUNNING"],
    "burst_buffer": "",
    "burst_buffer_state": "",
    "cluster": "ci",
    "cluster_features": "",
    "command": "",
    "comment": "",
    "container": "",
    "contiguous": False,
    "core_spec": None,
    "thread_spec": None,
    "cores_per_socket": None,
    "billable_tres": 1.0,
    "cpus_per_task": None,
    "cpu_frequency_minimum": None,
    "cpu_frequency_maximum": None,
    "cpu_frequency_governor": None,
    "cpus_per_tres": "",
    "deadline": 0,
    "delay_boot": 0,
    "dependency": "",
    "derived_exit_code": 0,
    "eligible_time": 1796002351,
    "end_time": 1827538353,
    "excluded_nodes": "",
    "exit_code": 0,
    "features": "",
    "federation_origin": "",
    "federation_siblings_active": "",
    "federation_siblings_viable": "",
    "gres_detail": ["gpu:2(IDX:0-1)"],
    "group_id": 1001,
    "group_name": "alice",
    "job_id": 1,
    "job_resources": {
        "nodes": "vm",
        "allocated_cores": 1,
        "allocated_hosts": 1,
        "allocated_nodes": [
            {
                "sockets": {"0": {"cores": {"0": "allocated"}}},
                "nodename": "vm",
                "cpus_used": 0,
                "memory_used": 0,
                "memory_allocated": 0,
            }
        ],
    },
    "job_state": "RUNNING",
    "last_sched_evaluation": 1796002353,
    "licenses": "",
    "max_cpus": 0,
    "max_nodes": 0,
    "mcs_label": "",
    "memory_per_tres": "",
    "name": "wrap",
    "nodes": "vm",
    "nice": None,
    "tasks_per_core": None,
    "tasks_per_node": 0,
    "tasks_per_socket": None,
    "tasks_per_board": 0,
    "cpus": 1,
    "node_count": 1,
    "tasks": 1,
    "het_job_id": 0,
    "het_job_id_set": "",
    "het_job_offset": 0,
    "partition": "debug",
    "prefer": "",
    "memory_per_node": None,
    "memory_per_cpu": None,
    "minimum_cpus_per_node": 1,
    "minimum_tmp_disk_per_node": 0,
    "preempt_time": 0,
    "pre_sus_time": 0,
    "priority": 4294901759,
    "profile": None,
    "qos": "",
    "reboot": False,
    "required_nodes": "",
    "requeue": True,
    "resize_time": 0,
    "restart_cnt": 0,
    "resv_name": "",
    "shared": None,
    "show_flags": ["SHOW_ALL", "SHOW_DETAIL", "SHOW_LOCAL"],
    "sockets_per_board": 0,
    "sockets_per_node": None,
    "start_time": 1796002353,
    "state_description": "",
    "state_reason": "None",
    "standard_error": "",
    "standard_input": "/dev/null",
    "standard_output": "/home/alice/runs/slurm-%j.out",
    "submit_time": 1796002351,
    "suspend_time": 0,
    "system_comment": "",
    "time_limit": None,
    "time_minimum": 0,
    "threads_per_core": None,
    "tres_bind": "",
    "tres_freq": "",
    "tres_per_job": "",
    "tres_per_node": "gres:gpu:2",
    "tres_per_socket": "",
    "tres_per_task": "",
    "tres_req_str": "cpu=1,mem=24105M,node=1,billing=1",
    "tres_alloc_str": "cpu=1,node=1,billing=1",
    "user_id": 1001,
    "user_name": "alice",
    "wckey": "",
    "current_working_directory": "/home/alice/runs",
}


def squeue_job(**fields: Any) -> dict[str, Any]:
    """A 22.05 job object with `fields` set (the fields that follow them adjusted)."""
    job = copy.deepcopy(JOB_22_05)
    unknown = set(fields) - set(job)
    if unknown:
        raise KeyError(f"not a 22.05 squeue job key: {', '.join(sorted(unknown))}")
    job.update(fields)
    nodes = expand(job["nodes"])
    job["group_id"], job["group_name"] = job["user_id"], job["user_name"]
    job["batch_host"] = nodes[0]
    job["node_count"] = len(nodes)
    allocated = job["job_resources"]["allocated_nodes"][0]
    job["job_resources"] = {
        "nodes": job["nodes"],
        "allocated_cores": len(nodes),
        "allocated_hosts": len(nodes),
        "allocated_nodes": [{**allocated, "nodename": n} for n in nodes],
    }
    job["tres_per_node"] = "gres:" + job["gres_detail"][0].split("(")[0]
    job["current_working_directory"] = f"/home/{job['user_name']}"
    job["standard_output"] = f"/home/{job['user_name']}/slurm-%j.out"
    job["cluster"] = "hpc"
    return job

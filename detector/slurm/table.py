"""The job table: Slurm's job list and `scontrol listpids` parsed into one immutable value.

Built from the raw inputs under their snapshot names, so a live fetch and a replayed snapshot
give the same table.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from hpcsec.detector.slurm import parse as slurm
from hpcsec.detector.slurm.parse import JobRecord, PidJob

# Job states (as parsed) of a job that holds resources on its nodes.
ON_NODE_STATES = (
    "RUNNING",
    "COMPLETING",
    "CONFIGURING",
    "SUSPENDED",
    "RESIZING",
    "SIGNALING",
    "STAGE_OUT",
)
INPUTS = ("slurm-jobs.json", "slurm-listpids.txt", "slurm-jobs-detail.txt")


@dataclass(frozen=True)
class JobTable:
    jobs: dict[str, JobRecord]
    listpids: dict[int, PidJob]
    errors: tuple[str, ...] = ()  # of the job list or listpids: the list is not known whole
    # of `scontrol show job -d`, read for GPU indices alone: the jobs it names have their GPUs
    # unknown, the list stays known (a user's text in that listing must not blind the node)
    gpu_errors: tuple[str, ...] = ()

    def jobs_on(self, host: str, states: tuple[str, ...] = ON_NODE_STATES) -> list[JobRecord]:
        """Jobs holding resources on `host`, by job id."""
        return sorted(
            (j for j in self.jobs.values() if j.runs_on(host) and (j.state in states)),
            key=lambda j: int(j.job_id),
        )


EMPTY_TABLE = JobTable({}, {})


def build_table(raw: dict[str, str | None]) -> JobTable:
    """Parse the raw inputs into one table; problems are collected, not raised."""
    errors: list[str] = []
    gpu_errors: tuple[str, ...] = ()
    jobs: dict[str, JobRecord] = {}
    if raw.get("slurm-jobs.json"):
        parsed = slurm.parse_jobs_json(raw["slurm-jobs.json"] or "")
        errors.extend(parsed.errors)
        jobs = {j.job_id: j for j in parsed.jobs}
    if raw.get("slurm-jobs-detail.txt"):
        detail = slurm.parse_show_job_detail(raw["slurm-jobs-detail.txt"] or "")
        # a broken first line of no job's id: the text of the job listed before wrote it
        cut = {
            before: broken
            for broken, before in detail.cut_short.items()
            if broken not in jobs and before in jobs
        }
        gpu_errors = detail.errors + tuple(
            f"job {before}: its text wrote the first line of job {broken}, which is not a "
            f"job: {slurm.UNTRUSTED}"
            for before, broken in cut.items()
        )
        for job_id, pairs in detail.gpus.items():
            if job_id in jobs and jobs[job_id].gpus_by_node is None and job_id not in cut:
                jobs[job_id] = replace(jobs[job_id], gpus_by_node=tuple(pairs))
        for job_id in (detail.tampered | cut.keys()) & jobs.keys():
            jobs[job_id] = replace(jobs[job_id], listing_tampered=True)
    pids: dict[int, PidJob] = {}
    if raw.get("slurm-listpids.txt"):
        listed = slurm.parse_listpids(raw["slurm-listpids.txt"] or "")
        errors.extend(listed.errors)
        pids = listed.pids
    return JobTable(jobs, pids, tuple(errors), gpu_errors)

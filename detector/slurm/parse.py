"""Parsers for what Slurm prints: job JSON (two shapes), `scontrol show job -d`, listpids, cgroups.

Every parser is pure (text in, typed records out) so the same code runs on live command output
and on the copies a node snapshot keeps. Malformed records are skipped and counted in the
result's `errors`, never raised: a half-readable squeue output still gives the jobs it has.

Job JSON comes in two shapes that we both accept:
- Slurm 22.05 (`squeue --json`, slurmrestd v0.0.38): `job_state` is a string and times are
  plain integers (0 = unknown).
- Slurm 23.02+ (data_parser v0.0.39+): `job_state` is a list (base state first, then flags)
  and numbers are `{"set": bool, "infinite": bool, "number": n}` objects.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, NamedTuple

from hpcsec.detector.core import hostlist
from hpcsec.detector.core.schema import rfc3339
from hpcsec.detector.core.text import escape_surrogates, from_node_bytes


@dataclass(frozen=True)
class JobRecord:
    """One job as the controller reports it."""

    job_id: str
    user: str | None = None
    user_id: int | None = None
    account: str | None = None
    partition: str | None = None
    nodes: tuple[str, ...] = ()
    state: str | None = None
    start: str | None = None
    end: str | None = None
    name: str | None = None
    # GPU indices per node from the GRES IDX detail; None when no detail was available.
    gpus_by_node: tuple[tuple[str, tuple[int, ...]], ...] | None = None
    # its own text (name, wckey, paths) broke the lines of `scontrol show job -d`
    listing_tampered: bool = False

    def gpus_on(self, host: str) -> tuple[int, ...] | None:
        """GPU indices allocated on `host` (short name match); None when not known."""
        if self.gpus_by_node is None:
            return None
        short = host.split(".")[0]
        for node, gpus in self.gpus_by_node:
            if node.split(".")[0] == short:
                return gpus
        return ()

    def runs_on(self, host: str) -> bool:
        short = host.split(".")[0]
        return any(node.split(".")[0] == short for node in self.nodes)

    def fields(self, host: str) -> dict[str, Any]:
        """The `slurm.job.*` fields of this job as seen from `host` (None values omitted)."""
        gpus = self.gpus_on(host)
        out: dict[str, Any] = {
            "slurm.job.id": self.job_id,
            "slurm.job.user": self.user,
            "slurm.job.account": self.account,
            "slurm.job.partition": self.partition,
            "slurm.job.nodes": list(self.nodes) or None,
            "slurm.job.gpus": None if gpus is None else list(gpus),
            "slurm.job.state": self.state,
            "slurm.job.start": self.start,
            "slurm.job.name": self.name,
            "slurm.job.listing_tampered": True if self.listing_tampered else None,
        }
        return {k: v for k, v in out.items() if v is not None}


@dataclass(frozen=True)
class JobsParse:
    """Jobs from one document, plus what could not be read (one line per problem)."""

    jobs: tuple[JobRecord, ...] = ()
    errors: tuple[str, ...] = ()
    slurm_release: str | None = None


@dataclass(frozen=True)
class PidJob:
    """Which job a process belongs to, and how we know it."""

    job_id: str
    step: str | None
    source: str  # cgroup | listpids | environ


@dataclass(frozen=True)
class ListPids:
    pids: dict[int, PidJob] = field(default_factory=dict)
    errors: tuple[str, ...] = ()


# ------------------------------------------------------------------ JSON (both shapes)


def _number(value: Any) -> int | None:
    """A plain int (22.05) or a {set, infinite, number} object (23.02+); None when unset."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, dict):
        if not value.get("set", False) or value.get("infinite", False):
            return None
        return _number(value.get("number"))
    return None


def _time(value: Any) -> str | None:
    seconds = _number(value)
    if not seconds or seconds <= 0:  # 0 = not started / unknown
        return None
    try:
        return rfc3339(datetime.fromtimestamp(seconds, UTC))
    except (OverflowError, OSError, ValueError):
        return None


def _text(value: Any) -> str | None:
    """A job's string as event text (Slurm output is read with surrogateescape: a job or
    user name that is not UTF-8 keeps its bytes as `\\xNN`)."""
    if not isinstance(value, str):
        return None
    value = escape_surrogates(value).strip()
    return None if value in ("", "(null)") else value


# 22.05 prints one word per job, a flag taking precedence over the base state (Slurm's
# job_state_string); 23.02+ lists the base state then the flags. Same word from both shapes:
_FLAG_PRECEDENCE = (
    "COMPLETING",
    "STAGE_OUT",
    "CONFIGURING",
    "RESIZING",
    "REQUEUED",
    "REQUEUE_FED",
    "REQUEUE_HOLD",
    "SPECIAL_EXIT",
    "STOPPED",
    "REVOKED",
    "RESV_DEL_HOLD",
    "SIGNALING",
)


def _state(value: Any) -> str | None:
    if isinstance(value, list):
        words = [w for w in value if isinstance(w, str)]
        flags = [f for f in _FLAG_PRECEDENCE if f in words[1:]]
        value = flags[0] if flags else (words[0] if words else None)
    return _text(value)


_GRES_IDX = re.compile(r"(?:^|,)gpu(?::[^:(,]+)?(?::\d+)?\(IDX:([^)]*)\)")


def gres_gpu_indices(gres: str) -> tuple[int, ...]:
    """GPU indices from a GRES detail string: `gpu:2(IDX:0-1)`, `gpu:a100:3(IDX:0,2-3)`.

    Other GRES in the same string (`shard`, `mps`) are ignored; `IDX:N/A` means none.
    Raises ValueError on a malformed index list.
    """
    out: list[int] = []
    for match in _GRES_IDX.finditer(gres):
        body = match.group(1).strip()
        if body in ("", "N/A"):
            continue
        for item in body.split(","):
            lo, _, hi = item.strip().partition("-")
            if not lo.isdigit() or (hi and not hi.isdigit()):
                raise ValueError(f"bad GPU index {item!r} in GRES {gres!r}")
            start, stop = int(lo), int(hi or lo)
            if stop < start or stop - start > 4096:
                raise ValueError(f"bad GPU index range {item!r} in GRES {gres!r}")
            out.extend(range(start, stop + 1))
    return tuple(sorted(set(out)))


def _job_from_json(raw: dict[str, Any]) -> JobRecord:
    job_id = _number(raw.get("job_id"))
    if job_id is None:
        raise ValueError("job without a numeric job_id")
    nodes = tuple(hostlist.expand(_text(raw.get("nodes")) or ""))
    gpus_by_node = None
    detail = raw.get("gres_detail")
    if isinstance(detail, list) and nodes:
        # One entry per allocated node, in the node list's order; an empty list on a
        # running job means it holds no GRES (gpus = []).
        per_node = [gres_gpu_indices(str(d)) for d in detail]
        gpus_by_node = tuple(
            (node, per_node[i] if i < len(per_node) else ()) for i, node in enumerate(nodes)
        )
    return JobRecord(
        job_id=str(job_id),
        user=_text(raw.get("user_name")),
        user_id=_number(raw.get("user_id")),
        account=_text(raw.get("account")),
        partition=_text(raw.get("partition")),
        nodes=nodes,
        state=_state(raw.get("job_state")),
        start=_time(raw.get("start_time")),
        end=_time(raw.get("end_time")),
        name=_text(raw.get("name")),
        gpus_by_node=gpus_by_node,
    )


def _release(meta: Any) -> str | None:
    if not isinstance(meta, dict):
        return None
    for key in ("Slurm", "slurm"):  # 22.05 capitalises it, 23.02+ does not
        info = meta.get(key)
        if isinstance(info, dict) and isinstance(info.get("release"), str):
            return info["release"]
    return None


def parse_jobs_json(text: str) -> JobsParse:
    """`squeue --json`, slurmrestd `/slurm/v0.0.3x/job(s)` or `scontrol show job --json`."""
    try:
        doc = json.loads(text)
    except ValueError as exc:
        return JobsParse(errors=(f"job JSON is not JSON: {exc}",))
    if not isinstance(doc, dict) or not isinstance(doc.get("jobs"), list):
        return JobsParse(errors=("job JSON has no 'jobs' list",))
    jobs, errors = [], []
    for n, raw in enumerate(doc["jobs"]):
        if not isinstance(raw, dict):
            errors.append(f"jobs[{n}] is not an object")
            continue
        try:
            jobs.append(_job_from_json(raw))
        except (ValueError, TypeError) as exc:
            errors.append(f"jobs[{n}]: {exc}")
    for err in doc.get("errors") or []:
        if isinstance(err, dict):  # Slurm's own errors in the document
            errors.append(f"slurm: {err.get('error') or err.get('description') or err}")
    return JobsParse(tuple(jobs), tuple(errors), _release(doc.get("meta")))


# ------------------------------------------------------------------ scontrol show job -d

_JOB_START = re.compile(r"^JobId=(\d+)\b", re.M)
_NODE_GRES = re.compile(r"\s+Nodes=(\S+)\s.*?\bGRES=(\S+)")
# lines Slurm prints once per job, at the start of a line: a second one was written by a user
_ONCE = ("   UserId=", "   Socks/Node=", "   JOB_GRES=", "   HetJobIdSet=", "   SLUID=")
# lines Slurm may print between the JobId= line and UserId= (a heterogeneous job's parts;
# 25.11's SLUID with -d)
_BEFORE_USER = ("   HetJobIdSet=", "   SLUID=")


class ShowJobDetail(NamedTuple):
    gpus: dict[str, tuple[tuple[str, tuple[int, ...]], ...]]  # job id -> (node, GPU indices)
    errors: tuple[str, ...]
    tampered: frozenset[str]  # jobs whose own text broke the listing's lines
    # a block whose first line is broken -> the job listed just before it: if no job has
    # the block's id, that job's text wrote the line, and its own block was cut short by it
    cut_short: dict[str, str]


def parse_show_job_detail(text: str) -> ShowJobDetail:
    """Per-job, per-node GPU indices from `scontrol show job -d` (any number of jobs).

    The detail lines look like `     Nodes=gpu[001-002] CPU_IDs=0-3 Mem=0 GRES=gpu:4(IDX:0-3)`;
    a job with GRES but no detail line on a node holds no GPU there.

    Slurm prints what a user names (job name, wckey, comment, paths) raw, line breaks
    included, so only its own structure decides: detail lines count in the run right after
    the job's `JOB_GRES=` line, which follows its `Socks/Node=` line. A job listed twice, a
    block with one of those lines (or `UserId=`) twice, or a first line broken by the job's
    name is an error: that job's GPUs are not taken from the listing (unknown, not forged),
    and the job is named in `tampered` (its owner hid its allocation: an alert of its own).
    """
    out: dict[str, tuple[tuple[str, tuple[int, ...]], ...]] = {}
    errors: list[str] = []
    starts = list(_JOB_START.finditer(text))
    listed = Counter(m.group(1) for m in starts)
    doubled: set[str] = set()
    tampered: set[str] = set()
    cut_short: dict[str, str] = {}
    for i, start in enumerate(starts):
        job = start.group(1)
        if listed[job] > 1:
            if job not in doubled:  # said once
                doubled.add(job)
                errors.append(f"job {job}: listed {listed[job]} times: {UNTRUSTED}")
            continue  # which of the jobs wrote the other block is not known: none is named
        block = text[start.start() : starts[i + 1].start() if i + 1 < len(starts) else len(text)]
        lines = block.split("\n")
        problem = _ambiguous(lines)
        if problem:
            errors.append(f"job {job}: {problem}: {UNTRUSTED}")
            tampered.add(job)
            if problem == _BROKEN_FIRST_LINE and i > 0 and listed[starts[i - 1].group(1)] == 1:
                # either this job's own name broke its first line, or this is no job's line
                # at all, written by the text of the job listed before (whose block it cut
                # short): the job list tells (table.build_table)
                cut_short[job] = starts[i - 1].group(1)
            continue
        pairs: list[tuple[str, tuple[int, ...]]] = []
        try:
            for line in _detail_lines(lines):
                m = _NODE_GRES.match(line)
                if m is not None:
                    gpus = gres_gpu_indices(m.group(2))
                    pairs.extend((node, gpus) for node in hostlist.expand(m.group(1)))
        except ValueError as exc:
            errors.append(f"job {job}: {exc}")
            continue
        out[job] = tuple(pairs)
    return ShowJobDetail(out, tuple(errors), frozenset(tampered), cut_short)


UNTRUSTED = "a name or path of a job holds a line break; its GPUs are not taken from this listing"
_BROKEN_FIRST_LINE = "its first line is broken"


def _ambiguous(lines: list[str]) -> str | None:
    second = 1
    while second < len(lines) and lines[second].startswith(_BEFORE_USER):
        second += 1
    if second >= len(lines) or not lines[second].startswith("   UserId="):
        return _BROKEN_FIRST_LINE
    for key in _ONCE:
        if sum(1 for line in lines if line.startswith(key)) > 1:
            return f"{key.strip()} printed twice"
    gres = [i for i, line in enumerate(lines) if line.startswith("   JOB_GRES=")]
    if gres and not lines[gres[0] - 1].startswith("   Socks/Node="):
        return "JOB_GRES= out of its place"
    return None


def _detail_lines(lines: list[str]) -> list[str]:
    """The `Nodes=` lines right after the block's JOB_GRES= line."""
    for i, line in enumerate(lines):
        if line.startswith("   JOB_GRES="):
            run = []
            for detail in lines[i + 1 :]:
                if not detail.startswith("     Nodes="):
                    break
                run.append(detail)
            return run
    return []


# ------------------------------------------------------------------ scontrol listpids


def parse_listpids(text: str) -> ListPids:
    """`scontrol listpids` (all jobs on this node): `PID JOBID STEPID LOCALID GLOBALID` rows."""
    pids: dict[int, PidJob] = {}
    errors: list[str] = []
    for n, line in enumerate(text.splitlines(), 1):
        cols = escape_surrogates(line).split()
        if not cols or cols[0] == "PID":
            continue
        if len(cols) < 3 or not cols[0].isdecimal() or not cols[1].isdecimal():
            errors.append(f"listpids line {n}: {' '.join(cols)[:200]!r}")
            continue
        pids[int(cols[0])] = PidJob(cols[1], cols[2], "listpids")
    return ListPids(pids, tuple(errors))


# ------------------------------------------------------------------ /proc/<pid>/cgroup

# Anchored at the hierarchy root: a user with a delegated cgroup subtree can create
# `…/job_1/…` below it, but not at the root, so these names cannot be forged.
_CGROUP_V1 = re.compile(r"^/slurm[^/]*/uid_\d+/job_(\d+)(?:/step_([^/]+))?")
_CGROUP_V2 = re.compile(
    r"^/(?:system\.slice/)?(?:[^/]+_)?slurmstepd\.scope/job_(\d+)(?:/step_([^/]+))?"
)


def job_from_cgroup(text: str) -> PidJob | None:
    """The job of a process from its `/proc/<pid>/cgroup` (cgroup v1 or v2 layout).

    Lines end at `\n` only: Linux refuses it in a cgroup's name, but not `\r`, where
    str.splitlines also breaks, so a user's delegated `x\r0::/slurmstepd.scope/job_1` would
    otherwise read as a line anchored at the root."""
    for line in text.split("\n"):
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        path = parts[2].strip()
        m = _CGROUP_V1.match(path) or _CGROUP_V2.match(path)
        if m:
            return PidJob(m.group(1), m.group(2), "cgroup")
    return None


def job_from_environ(raw: bytes) -> PidJob | None:
    """SLURM_JOB_ID (and SLURM_STEP_ID) from a NUL-separated environ; the user can set these."""
    job_id = step = None
    for item in raw.split(b"\0"):
        if item.startswith(b"SLURM_JOB_ID="):
            job_id = from_node_bytes(item[13:]).strip()
        elif item.startswith(b"SLURM_STEP_ID="):
            step = from_node_bytes(item[14:]).strip() or None
    if not job_id or not job_id.isdecimal() or not job_id.isascii():
        return None
    return PidJob(job_id, step, "environ")

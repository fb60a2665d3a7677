"""JobContext: which Slurm job a process belongs to, with a cached view of the jobs.

The agent must never wait on Slurm. Every command runs with a short timeout; the job table is
cached for `ttl` seconds and refreshed early when a job starts or ends (the prolog/epilog
events file changes, or a process names a job we have not seen). When the controller cannot be
reached the context emits ONE `sensor_status` event and events keep flowing without job fields;
it retries after the TTL and emits one more status when Slurm answers again.

Slurm 22.05's `squeue --json` lists every job of the cluster, whatever filter it is given, and
every node's agent asks: at a TTL of 30 s, 1,000 nodes cost the controller 33 full job dumps a
second. So a refresh asks the node first (`scontrol listpids`, answered by the node's own
slurmd), and uses the controller's last answer again only while it says every job on this
node is RUNNING and those are exactly the jobs listpids lists, no job started or ended (the
hooks' events file, a process naming a job the table lacks), and it is less than
CONTROLLER_TTL_FACTOR TTLs old: a node running the same training job for days asks the
controller every 5 minutes, not every 30 s. A job ending, completing, starting, or on this
node without a process here (a multi-node job between its steps) is asked about at every
TTL, as before. Meanwhile, a controller outage is noticed at the next question asked.

Raw inputs go through `ctx.raw_input` under their snapshot names, so a snapshot replays them:
  slurm-jobs.json         `squeue --json` (every job; Slurm 22.05 ignores filters with --json)
  slurm-listpids.txt      `scontrol listpids` (every job on this node)
  slurm-jobs-detail.txt   `scontrol show job -d` (GRES IDX per node, when the JSON lacks it)
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

from hpcsec.detector.core.schema import Event
from hpcsec.detector.slurm import parse as slurm
from hpcsec.detector.slurm.attribution import (
    ProcessReader,
    ProcReader,
    attribute,
    job_fields,
    unlisted_claim,
)
from hpcsec.detector.slurm.hookstate import DEFAULT_HOOK_STATE_DIR as DEFAULT_HOOK_STATE_DIR
from hpcsec.detector.slurm.hookstate import HOOK_EVENTS_FILE, default_hook_state_dir
from hpcsec.detector.slurm.parse import JobRecord, PidJob
from hpcsec.detector.slurm.table import EMPTY_TABLE, INPUTS, ON_NODE_STATES, JobTable, build_table
from hpcsec.sensors.base import SensorContext
from hpcsec.sensors.procinfo import owner_key

SENSOR = "slurm_context"
STATE_KEY = "slurm.jobs"  # where the shared JobContext lives in SensorContext.state
# A process naming a job the cached table lacks asks for a fresh table, at most this often:
# prompt for a job that just started, bounded against forged SLURM_JOB_IDs.
MIN_REFRESH_INTERVAL_S = 1.0
# Claimed job ids a fresh table did not hold (forged, or already gone): no more refreshes.
MAX_CHECKED_CLAIMS = 4096
# The controller's job list is used again, while this node's jobs are the same, for up to
# this many TTLs (the job fields it gives do not change while a job runs: user, account,
# name, nodes, GPUs).
CONTROLLER_TTL_FACTOR = 10
CONTROLLER_INPUTS = ("slurm-jobs.json", "slurm-jobs-detail.txt")


class SlurmUnreachable(Exception):
    """A Slurm command is missing, timed out or failed (`stdout`, `stderr`: what a failed
    one wrote)."""

    def __init__(self, message: str, stdout: str = "", stderr: str = ""):
        super().__init__(message)
        self.stdout, self.stderr = stdout, stderr


# `scontrol listpids` lists each step in turn: a step that ends meanwhile (its stepd gone)
# is said so on stderr and the exit code is 1, the other steps' pids listed all the same
_STEP_GONE = re.compile(r"^\S+ does not exist on this node\.$")


@dataclass(frozen=True)
class SlurmCommands:
    """Runs the Slurm client commands with a hard timeout each."""

    timeout_s: float = 3.0
    env: dict[str, str] | None = None  # e.g. SLURM_CONF for a non-default config

    def available(self) -> bool:
        return shutil.which("squeue") is not None and shutil.which("scontrol") is not None

    def _run(self, argv: list[str]) -> str:
        if shutil.which(argv[0]) is None:
            raise SlurmUnreachable(f"{argv[0]} not found")
        env = None if self.env is None else {**os.environ, **self.env}
        try:
            proc = subprocess.run(
                argv,
                capture_output=True,
                encoding="utf-8",
                errors="surrogateescape",  # job and user names are escaped where parsed
                timeout=self.timeout_s,
                env=env,
                stdin=subprocess.DEVNULL,
                check=False,
            )
        except subprocess.TimeoutExpired:
            raise SlurmUnreachable(
                f"{' '.join(argv)} timed out after {self.timeout_s:g}s"
            ) from None
        except OSError as exc:
            raise SlurmUnreachable(f"{' '.join(argv)}: {exc}") from None
        if proc.returncode != 0:
            err = (proc.stderr or proc.stdout).strip().splitlines()
            raise SlurmUnreachable(
                f"{' '.join(argv)} exited {proc.returncode}: {err[-1] if err else 'no output'}",
                proc.stdout,
                proc.stderr,
            )
        return proc.stdout

    def jobs_json(self) -> str:
        return self._run(["squeue", "--json"])

    def listpids(self) -> str:
        # exits 1 with "No job steps exist on this node." when nothing runs here: not an outage
        try:
            return self._run(["scontrol", "listpids"])
        except SlurmUnreachable as exc:
            if "No job steps exist" in str(exc):
                return ""
            complaints = exc.stderr.strip().splitlines()
            if (
                exc.stdout.startswith("PID")
                and complaints
                and all(map(_STEP_GONE.match, complaints))
            ):
                # a job's step ended while it listed (every job end, on a busy node): what it
                # listed of the others holds, as a refresh a moment later would
                return exc.stdout
            raise

    def jobs_detail(self) -> str:
        return self._run(["scontrol", "show", "job", "-d"])


class JobContext:
    """pid -> job and job id -> details, refreshed at most every `ttl` seconds."""

    def __init__(
        self,
        commands: SlurmCommands | None = None,
        ttl_s: float = 30.0,
        events_file: str | None = None,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.commands = commands or SlurmCommands()
        self.ttl_s = ttl_s
        self.events_file = events_file
        self.clock = clock
        self.table: JobTable = EMPTY_TABLE
        self.reachable: bool | None = None  # None: never asked
        self._fetched_at: float | None = None
        self._raw: dict[str, str | None] = {}
        self._events_mtime: float | None = None
        self._pending_status: list[Event] = []
        self.refreshes = 0
        # job ids named by environments and not in the table: waiting for a fresh table, or
        # checked against one fetched after they were seen (then decided: no such job here)
        self._pending_claims: set[str] = set()
        self._checked_claims: set[str] = set()
        # the controller's last answer (CONTROLLER_INPUTS), when, and this node's jobs then
        self._controller: dict[str, str | None] | None = None
        self._controller_at = 0.0
        self._controller_jobs: frozenset[str] = frozenset()
        self._controller_due = True  # a job started or ended: ask the controller again
        # The agent's slurm_jobs sensor thread and its sampler (capturing the node view) may
        # refresh at once when the sensor runs late: one fetch at a time, one status each.
        self._lock = threading.RLock()

    # -------------------------------------------------------------- refresh
    def invalidate(self) -> None:
        """Forget the cache: the next lookup asks Slurm again (job started or ended)."""
        with self._lock:  # not while a fetch runs: it would clear what this sets
            self._fetched_at = None
            self._controller_due = True

    def _stale(self) -> bool:
        if self.events_file:  # the prolog/epilog appended a job start or end
            try:
                mtime = os.stat(self.events_file).st_mtime
            except OSError:
                mtime = None
            if mtime != self._events_mtime:
                self._events_mtime = mtime
                self._controller_due = True
                return True
        return self._fetched_at is None or self.clock() - self._fetched_at >= self.ttl_s

    def refresh(self, ctx: SensorContext, force: bool = False) -> None:
        """Load the job table (from the snapshot when replaying, else Slurm or the cache)."""
        with self._lock:
            self._refresh(ctx, force)

    def _refresh(self, ctx: SensorContext, force: bool) -> None:
        if ctx.replaying:
            raw = {name: ctx.raw_input(name, lambda: None) for name in INPUTS}
            self.table = build_table(raw)
            # a sample recorded while Slurm did not answer has no job list: reported as the
            # live source reported it, once per change
            if raw["slurm-jobs.json"] is None:
                self._unreachable(ctx, "no job list in this snapshot sample")
            else:
                self._reachable_again(ctx)
            return
        if not force and not self._stale():
            for name, data in self._raw.items():  # every snapshot sample gets the inputs
                if data is not None and ctx.recorder is not None:
                    ctx.recorder.record_input(name, data)
            return
        self._fetched_at = self.clock()
        self.refreshes += 1
        try:
            raw = self._fetch(ctx, force or self._controller_due)
        except SlurmUnreachable as exc:
            self._unreachable(ctx, str(exc))
            self.table = EMPTY_TABLE
            self._raw = {}
            self._controller = None
            return
        self._reachable_again(ctx)
        self._raw = raw
        self.table = build_table(raw)
        self._settle_claims()
        if self.table.errors or self.table.gpu_errors:
            errors = [*self.table.errors, *self.table.gpu_errors]
            self._pending_status.append(
                ctx.status(
                    SENSOR,
                    "malformed",
                    f"{len(errors)} Slurm records skipped: " + "; ".join(errors[:5]),
                    **{"hpcsec.parse_errors": errors[:50]},
                )
            )

    def _unreachable(self, ctx: SensorContext, reason: str) -> None:
        if self.reachable is not False:
            self._pending_status.append(
                ctx.status(
                    SENSOR, "unavailable", f"Slurm unreachable, events carry no job: {reason}"
                )
            )
        self.reachable = False

    def _reachable_again(self, ctx: SensorContext) -> None:
        if self.reachable is False:
            self._pending_status.append(ctx.status(SENSOR, "ok", "Slurm reachable again"))
        self.reachable = True

    def _fetch(self, ctx: SensorContext, ask_controller: bool) -> dict[str, str | None]:
        """The node's job pids, and the controller's job list: asked again only when
        `ask_controller`, this node's jobs changed, or its last answer is too old."""
        cmds = self.commands
        raw: dict[str, str | None] = {}
        raw["slurm-listpids.txt"] = ctx.raw_input("slurm-listpids.txt", cmds.listpids)
        local = frozenset(
            pid_job.job_id
            for pid_job in slurm.parse_listpids(raw["slurm-listpids.txt"] or "").pids.values()
        )
        last = self._controller
        if (
            last is not None
            and not ask_controller
            and local == self._controller_jobs
            and self.clock() - self._controller_at < self.ttl_s * CONTROLLER_TTL_FACTOR
            and self._settled_here(ctx.host_name, local)
        ):
            for name, data in last.items():  # every snapshot sample gets the inputs
                raw[name] = ctx.raw_input(name, partial(_same, data))
            return raw
        raw["slurm-jobs.json"] = ctx.raw_input("slurm-jobs.json", cmds.jobs_json)
        jobs = slurm.parse_jobs_json(raw["slurm-jobs.json"] or "")
        # 22.05's JSON already carries gres_detail; ask for the text only when it does not
        if any(j.gpus_by_node is None and j.nodes for j in jobs.jobs):
            raw["slurm-jobs-detail.txt"] = ctx.raw_input("slurm-jobs-detail.txt", cmds.jobs_detail)
        self._controller = {name: raw[name] for name in CONTROLLER_INPUTS if name in raw}
        self._controller_at = self.clock()
        self._controller_jobs = local
        self._controller_due = False
        return raw

    def _settled_here(self, host: str, local: frozenset[str]) -> bool:
        """Whether the controller's last answer may stand for this node: every job it puts
        here is RUNNING, and those are the jobs listpids lists. A job completing, starting
        or ending changes state with no change in listpids (its epilog runs after its
        steps are gone), and a multi-node job's steps come and go: those are asked about."""
        here = self.table.jobs_on(host)
        return all(job.state == "RUNNING" for job in here) and {job.job_id for job in here} == local

    def _settle_claims(self) -> None:
        """A table fetched after a claim was seen decides it: listed, or not a job here."""
        if len(self._checked_claims) > MAX_CHECKED_CLAIMS:
            self._checked_claims.clear()
        self._checked_claims |= self._pending_claims - set(self.table.jobs)
        self._pending_claims.clear()

    def pending_claims(self) -> frozenset[str]:
        """Job ids named by processes' environments that no table fetched since has settled:
        their processes' job is undecided until the next fetch."""
        return frozenset(self._pending_claims - set(self.table.jobs))

    def _may_refresh(self, ctx: SensorContext) -> bool:
        return (
            not ctx.replaying
            and self.reachable is True
            and self._fetched_at is not None
            and self.clock() - self._fetched_at >= MIN_REFRESH_INTERVAL_S
        )

    def take_status(self) -> list[Event]:
        """Status events produced since the last call (outage, recovery, parse errors)."""
        with self._lock:
            out, self._pending_status = self._pending_status, []
        return out

    # -------------------------------------------------------------- lookups
    def job(self, job_id: str) -> JobRecord | None:
        return self.table.jobs.get(job_id)

    def jobs_on(self, host: str, states: tuple[str, ...] = ON_NODE_STATES) -> list[JobRecord]:
        return self.table.jobs_on(host, states)

    def pid_job(
        self,
        ctx: SensorContext,
        pid: int,
        use_environ: bool = True,
        seen: dict[str, Any] | None = None,
        procs: ProcessReader | None = None,
    ) -> PidJob | None:
        """The job of `pid` (see `attribution.attribute`), reading the node through `procs`
        (default: the context's proc root). A job our cached table does not know yet started
        after the last fetch: the table is fetched again (at most every
        MIN_REFRESH_INTERVAL_S). That includes a job only the environment names (no Slurm
        cgroup, not yet in listpids): until a table fetched after it was seen settles it, the
        claim is pending (`pending_claims`) and the process's job undecided."""
        reader = procs or ProcReader(ctx.proc, partial(owner_key, ctx))
        found = attribute(pid, self.table, reader, seen, use_environ)
        newer = found is not None and found.job_id not in self.table.jobs
        if found is None and use_environ and not ctx.replaying:
            claim = unlisted_claim(pid, self.table, reader, seen)
            if claim is not None and claim not in self._checked_claims:
                self._pending_claims.add(claim)
                newer = True
        if newer and self._may_refresh(ctx):
            self.refresh(ctx, force=True)  # a job newer than our cache
        return found

    def fields_for_pid(
        self, ctx: SensorContext, pid: int, seen: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        """`slurm.job.*` of the process's job ({} when it has none); `seen` as in pid_job."""
        return job_fields(self.pid_job(ctx, pid, seen=seen), self.table, ctx.host_name)


def _same(data: str | None) -> str | None:
    return data


def hook_state_dir(ctx: SensorContext) -> str:
    """The hooks' state dir for this node: option `slurm_state_dir`, else the hooks' default,
    so an agent started without options still sees job starts and ends."""
    return ctx.options.get("slurm_state_dir") or default_hook_state_dir()


def job_context(ctx: SensorContext) -> JobContext:
    """The JobContext shared by the sensors and the enrichment of one node (kept in ctx.state).

    `ctx.options` may carry `slurm_ttl_s`, `slurm_timeout_s` and `slurm_state_dir` (where the
    prolog/epilog write slurm-events.jsonl; default as the hooks': $HPCSEC_STATE_DIR, else
    /var/lib/hpcsec).
    """
    existing = ctx.state.get(STATE_KEY)
    if isinstance(existing, JobContext):
        return existing
    events_file = os.path.join(hook_state_dir(ctx), HOOK_EVENTS_FILE)
    jc = JobContext(
        SlurmCommands(float(ctx.options.get("slurm_timeout_s", 3.0))),
        ttl_s=float(ctx.options.get("slurm_ttl_s", 30.0)),
        events_file=events_file,
    )
    ctx.state[STATE_KEY] = jc
    return jc

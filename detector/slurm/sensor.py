"""Slurm jobs on this node: who has a job here now, which jobs started and ended.

One `slurm_job` event per job running on this node (`present`), each with `slurm.node.users`
(every user with a job here, so rules can spot processes of users without one); `started` and
`ended` when the set of jobs changes between samples; and the records the prolog and epilog
appended to `<state dir>/slurm-events.jsonl` since the last sample (job start and end as slurmd
saw them, and epilog findings). A Slurm outage is not an end of every job: while the
controller does not answer, the previous set is kept and nothing is reported as ended.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Any

import orjson

from hpcsec.detector.core.schema import Event, new_event
from hpcsec.detector.slurm.jobs import HOOK_EVENTS_FILE, hook_state_dir, job_context
from hpcsec.sensors.base import SensorContext, SensorUnavailable

NAME = "slurm_jobs"
EVENTS_INPUT = HOOK_EVENTS_FILE
MAX_TAIL_BYTES = 4 << 20


class SlurmJobsSensor:
    name = NAME

    def collect(self, ctx: SensorContext) -> Iterable[Event]:
        jc = job_context(ctx)
        if not ctx.replaying and not jc.commands.available():
            raise SensorUnavailable("squeue/scontrol not found (no Slurm client on this node)")
        state = ctx.state.setdefault(NAME, {})
        events: list[Event] = list(self._hook_records(ctx, state))
        if events:
            jc.invalidate()  # a job started or ended: do not wait for the TTL
        jc.refresh(ctx)
        events.extend(jc.take_status())
        if jc.reachable is False:
            return events
        jobs = jc.jobs_on(ctx.host_name)
        users = sorted({j.user for j in jobs if j.user})
        current = {j.job_id: j.fields(ctx.host_name) for j in jobs}
        previous: dict[str, dict[str, Any]] | None = state.get("jobs")
        for fields in current.values():
            events.append(self._event(ctx, "present", fields, users))
        if previous is not None:
            for job_id in sorted(set(current) - set(previous), key=int):
                events.append(self._event(ctx, "started", current[job_id], users))
            for job_id in sorted(set(previous) - set(current), key=int):
                gone = dict(previous[job_id])
                ended = jc.job(job_id)  # still listed (COMPLETED…) until MinJobAge passes
                if ended is not None:
                    gone.update(
                        {
                            k: v
                            for k, v in ended.fields(ctx.host_name).items()
                            if k in ("slurm.job.state",)
                        }
                    )
                    if ended.end:
                        gone["slurm.job.end"] = ended.end
                events.append(self._event(ctx, "ended", gone, users))
        state["jobs"] = current
        return events

    @staticmethod
    def _event(ctx: SensorContext, action: str, fields: dict[str, Any], users: list[str]) -> Event:
        return new_event(
            "slurm_job",
            action,
            NAME,
            ctx.host_name,
            ctx.timestamp,
            {**fields, "slurm.node.users": users},
        )

    def _hook_records(self, ctx: SensorContext, state: dict[str, Any]) -> Iterable[Event]:
        """New lines of the prolog/epilog events file (tailed by byte offset)."""
        path = os.path.join(hook_state_dir(ctx), EVENTS_INPUT)

        def live() -> str | None:
            try:
                with open(path, "rb") as fh:
                    size = os.fstat(fh.fileno()).st_size
                    offset = state.get("events_offset", 0)
                    if offset > size:  # rotated or truncated: start over
                        offset = 0
                    fh.seek(offset)
                    data = fh.read(MAX_TAIL_BYTES)
            except OSError:
                return None
            # only whole lines; a partial last line is read again next time
            data = data[: data.rfind(b"\n") + 1]
            state["events_offset"] = offset + len(data)
            return data.decode("utf-8", "replace") if data else None

        text = ctx.raw_input(EVENTS_INPUT, live)
        bad: list[str] = []
        # `\n` only: orjson leaves U+0085, U+2028 and U+2029 of a process's name raw in a
        # line, and str.splitlines breaks there too (the hooks' finding was lost)
        for n, line in enumerate((text or "").split("\n"), 1):
            if not line.strip():
                continue
            try:
                record = orjson.loads(line)
            except orjson.JSONDecodeError:
                bad.append(f"{EVENTS_INPUT} line {n}: not JSON")
                continue
            if not isinstance(record, dict) or record.get("event.category") != "slurm_job":
                bad.append(f"{EVENTS_INPUT} line {n}: not a slurm_job event")
                continue
            yield record
        if bad:
            yield ctx.status(
                NAME,
                "malformed",
                f"{len(bad)} lines skipped: " + "; ".join(bad[:5]),
                **{"hpcsec.parse_errors": bad[:50]},
            )

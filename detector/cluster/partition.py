"""Which partition an event goes to, and which partitions a hub member owns.

A correlation can only count what reaches one member, so the partition key is the field the
cluster correlations group by for that kind of event:

- events with a user (file access, sockets, processes of jobs): `user.name`. A Slurm job
  belongs to one user, so a job's events on every node, and a user's events across all
  their jobs, meet on one member;
- firmware: the component, so the fleet majority of a component is counted in one place;
- process events: the process name, so the same miner started by different accounts on many
  nodes still meets on one member (the user of a process is a poor key: a spreading miner
  runs under whichever account was taken);
- anything else: the host.

The number of partitions is fixed (PARTITIONS); members own partitions `p` with
`p % N == I`, so any N up to PARTITIONS splits the work, and every partition has its own
durable consumer that a restarted member resumes.
"""

from __future__ import annotations

import hashlib
import re
from typing import Any

from hpcsec.detector.cluster.streams import EVENTS_SUBJECT_PREFIX, NODE_ALERTS_SUBJECT_PREFIX
from hpcsec.detector.core.errors import UsageError

PARTITIONS = 12  # divisible by 1, 2, 3, 4 and 6: common member counts split evenly
_HOST_TOKEN = re.compile(r"[^A-Za-z0-9_-]")


def partition_key(event: dict[str, Any]) -> str:
    category = event.get("event.category")
    if category == "firmware":
        return f"firmware:{event.get('firmware.component')}"
    if category == "process" and event.get("process.name"):
        return f"process:{event.get('process.name')}"
    user = event.get("user.name")
    if user:
        return f"user:{user}"
    return f"host:{event.get('host.name')}"


def partition_of(event: dict[str, Any]) -> int:
    digest = hashlib.blake2b(partition_key(event).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") % PARTITIONS


def host_token(host: object) -> str:
    """The host as one subject token (NATS tokens may not hold dots, spaces or wildcards)."""
    return _HOST_TOKEN.sub("_", str(host or "unknown"))[:128] or "unknown"


def subject_for(partition: int, host: object) -> str:
    return f"{EVENTS_SUBJECT_PREFIX}.p{partition:02d}.{host_token(host)}"


def alert_subject(host: object) -> str:
    """Where an agent publishes the alerts about its node."""
    return f"{NODE_ALERTS_SUBJECT_PREFIX}.{host_token(host)}"


def partition_subject(partition: int) -> str:
    return f"{EVENTS_SUBJECT_PREFIX}.p{partition:02d}.*"


def host_of_subject(subject: str) -> str:
    return subject.rsplit(".", 1)[-1]


def parse_member(text: str | None) -> tuple[int, int]:
    """`I/N` (0 <= I < N <= PARTITIONS); none means the only member, 0/1."""
    if not text:
        return 0, 1
    match = re.fullmatch(r"(\d+)/(\d+)", text.strip())
    if not match:
        raise UsageError(f"--member {text!r}: expected I/N, e.g. 0/2")
    index, count = int(match.group(1)), int(match.group(2))
    if not 0 < count <= PARTITIONS or not 0 <= index < count:
        raise UsageError(
            f"--member {text!r}: need 0 <= I < N and N <= {PARTITIONS} (the partition count)"
        )
    return index, count


def member_partitions(index: int, count: int) -> list[int]:
    return [p for p in range(PARTITIONS) if p % count == index]

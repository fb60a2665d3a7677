"""RDMA queue pairs from iproute2's `rdma -j res show qp`: one `rdma_qp` event per QP.

The kernel's RDMA netlink (nldev) reports every QP with its owner: a process id for QPs
created from user space, or the kernel module's name for kernel QPs (the GSI/SMI management
QPs of ib_core, IPoIB, Lustre's ko2iblnd, NVMe-oF, …). iproute2 prints, per QP
(rdma/res-qp.c, rdma/res.c):

    JSON  {"ifindex":0,"ifname":"mlx5_0","port":1,"lqpn":4735,"rqpn":6114,"type":"RC",
           "state":"RTS","rq-psn":…,"sq-psn":…,"path-mig-state":"MIGRATED","pdn":9,
           "pid":41000,"comm":"python3"}
    text  link mlx5_0/1 lqpn 4735 rqpn 6114 type RC state RTS … pid 41000 comm python3

`port` is absent (text: `mlx5_0/-`) until the QP is bound to a port; kernel QPs have no `pid`
(iproute2 before 5.x printed `pid 0`) and, in text, their `comm` in brackets. JSON is the
input we run and store in snapshots; the text parser reads saved text outputs.
"""

from __future__ import annotations

import json
import re
import subprocess
from dataclasses import dataclass
from typing import Any

from hpcsec.detector.core.schema import Event, new_event
from hpcsec.detector.core.text import escape_surrogates
from hpcsec.sensors.base import SensorContext, SensorUnavailable

NAME = "rdma_qp"
INPUT_NAME = "rdma-res-qp.json"
COMMAND = ("rdma", "-j", "res", "show", "qp")
TIMEOUT_S = 10.0
MAX_REPORTED_ERRORS = 20
U32_MAX = (1 << 32) - 1
# QPs need no privilege: a user may create a hundred thousand (up to the card's max_qp), and
# one event each took the agent 15 s of CPU and 380 MB every sample. A process's QPs on a
# device past MAX_LISTED_PER_PROCESS are counted on its last listed one (the rules on QPs
# alert once per process and device), and a sample lists MAX_LISTED_QPS of users' QPs,
# every process's first one before any other's second (`bounded`). Kernel QPs (storage
# clients, IPoIB) are no user's to multiply.
MAX_LISTED_PER_PROCESS = 256
MAX_LISTED_QPS = 32768


class QpOutputError(ValueError):
    """The whole output is unusable (not JSON, not a list of QPs)."""


@dataclass(frozen=True)
class QueuePair:
    device: str
    port: int | None
    lqpn: int
    qp_type: str
    state: str
    rqpn: int | None = None
    sq_psn: int | None = None
    rq_psn: int | None = None
    path_mig_state: str | None = None
    pdn: int | None = None
    pid: int | None = None
    comm: str | None = None

    @property
    def kernel(self) -> bool:
        return not self.pid

    def fields(self) -> dict[str, Any]:
        return {
            "rdma.device": self.device,
            "rdma.port": self.port,
            "rdma.qp.lqpn": self.lqpn,
            "rdma.qp.rqpn": self.rqpn,
            "rdma.qp.type": self.qp_type,
            "rdma.qp.state": self.state,
            "rdma.qp.sq_psn": self.sq_psn,
            "rdma.qp.rq_psn": self.rq_psn,
            "rdma.qp.path_mig_state": self.path_mig_state,
            "rdma.qp.pdn": self.pdn,
            "rdma.qp.kernel": self.kernel,
            "process.pid": None if self.kernel else self.pid,
            "process.name": None if self.kernel else self.comm,
            "rdma.qp.kernel_owner": self.comm if self.kernel else None,
        }


@dataclass(frozen=True)
class QpParse:
    qps: tuple[QueuePair, ...]
    errors: tuple[str, ...]  # "record N: why" for each record that was skipped


def _uint(record: dict, key: str, required: bool = False) -> int | None:
    value = record.get(key)
    if value is None and not required:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= U32_MAX:
        raise ValueError(f"{key} is not a 32-bit unsigned integer: {value!r}")
    return value


def _required_uint(record: dict, key: str) -> int:
    value = _uint(record, key, True)
    assert value is not None  # _uint raises for a required key it cannot read
    return value


def _required_text(record: dict, key: str) -> str:
    value = _text(record, key, True)
    assert value is not None  # _text raises for a required key it cannot read
    return value


def _text(record: dict, key: str, required: bool = False) -> str | None:
    value = record.get(key)
    if value is None and not required:
        return None
    if not isinstance(value, str) or not value:
        raise ValueError(f"{key} is not a string: {escape_surrogates(repr(value))[:200]}")
    return escape_surrogates(value)  # a comm or name that is not UTF-8, as `\\xNN`


def qp_from_record(record: Any) -> QueuePair:
    """One QP object of the JSON output; ValueError naming the bad key."""
    if not isinstance(record, dict):
        raise ValueError(f"not an object: {type(record).__name__}")
    for key in ("ifname", "lqpn", "type", "state"):
        if key not in record:
            raise ValueError(f"no {key}")
    return QueuePair(
        device=_required_text(record, "ifname"),
        port=_uint(record, "port"),
        lqpn=_required_uint(record, "lqpn"),
        qp_type=_required_text(record, "type"),
        state=_required_text(record, "state"),
        rqpn=_uint(record, "rqpn"),
        sq_psn=_uint(record, "sq-psn"),
        rq_psn=_uint(record, "rq-psn"),
        path_mig_state=_text(record, "path-mig-state"),
        pdn=_uint(record, "pdn"),
        pid=_uint(record, "pid"),
        comm=_text(record, "comm"),
    )


def _collect(records: list[Any]) -> QpParse:
    qps, errors = [], []
    for number, record in enumerate(records, 1):
        try:
            qps.append(qp_from_record(record))
        except ValueError as exc:
            errors.append(f"record {number}: {exc}")
    return QpParse(tuple(qps), tuple(errors))


# iproute2 before 7.0 writes a comm's control bytes raw, and 5.3-6.0 write `'` as `\'`:
# neither is JSON, and one process's name must not blank every QP of the node
_ESCAPED_QUOTE = re.compile(r"(?<!\\)((?:\\\\)*)\\'")


def parse_qp_json(text: str) -> QpParse:
    """`rdma -j res show qp` output; QpOutputError if it is not a JSON list."""
    try:
        data = json.loads(_ESCAPED_QUOTE.sub(r"\1'", text), strict=False)
    except json.JSONDecodeError as exc:
        raise QpOutputError(f"{INPUT_NAME}: not JSON: {exc}") from None
    if not isinstance(data, list):
        raise QpOutputError(f"{INPUT_NAME}: expected a JSON list, got {type(data).__name__}")
    return _collect(data)


_TEXT_NUMBERS = {"lqpn", "rqpn", "rq-psn", "sq-psn", "pdn", "pid"}


def _text_record(line: str) -> dict[str, Any]:
    # `comm` comes last and is the process's own name (spaces and `\r` included): the rest
    # of the line, never split into more keys (a comm of `x pid 0` made its QP the kernel's)
    head, sep, comm = line.partition(" comm ")
    tokens = head.split()
    if len(tokens) % 2:
        raise ValueError(f"odd number of words in {line.strip()!r}")
    if sep:
        tokens += ["comm", comm.rstrip(" \t")]
    record: dict[str, Any] = {}
    for key, value in zip(tokens[::2], tokens[1::2], strict=True):
        if key == "link":
            device, sep, port = value.rpartition("/")
            if not sep or not device:
                raise ValueError(f"bad link {value!r}")
            record["ifname"] = device
            if port != "-":
                record["port"] = int(port) if port.isdigit() else port
        elif key in _TEXT_NUMBERS:
            record[key] = int(value) if value.isdigit() else value
        elif key == "comm" and value.startswith("[") and value.endswith("]"):
            record["comm"] = value[1:-1]  # kernel owner, printed in brackets
        else:
            record[key] = value
    return record


def parse_qp_text(text: str) -> QpParse:
    """`rdma res show qp` text output, one QP per line."""
    records: list[Any] = []
    for line in text.split("\n"):  # not splitlines: a comm may hold `\r` (procinfo)
        if not line.strip():
            continue
        try:
            records.append(_text_record(line))
        except ValueError as exc:
            records.append(exc)  # keeps the record numbering of the output
    qps, errors = [], []
    for number, record in enumerate(records, 1):
        try:
            if isinstance(record, ValueError):
                raise record
            qps.append(qp_from_record(record))
        except ValueError as exc:
            errors.append(f"record {number}: {exc}")
    return QpParse(tuple(qps), tuple(errors))


def parse_qp_output(text: str) -> QpParse:
    """JSON when it looks like JSON, else the text form."""
    stripped = text.lstrip()
    if not stripped or stripped[0] in "[{":
        return parse_qp_json(stripped or "[]")
    return parse_qp_text(text)


def bounded(qps: tuple[QueuePair, ...]) -> tuple[list[dict[str, Any]], int]:
    """The fields of the QPs to list, in output order, and how many users' QPs were dropped.

    Every process's first QP on a device is listed first (up to MAX_LISTED_QPS of them), then
    its others up to MAX_LISTED_PER_PROCESS while the sample has room; what is not listed is
    counted on its process's last listed QP. So no process can hide another's QPs by having
    many of its own (filling the sample's room before the other's came in the output); only
    QPs of processes past MAX_LISTED_QPS distinct ones are dropped."""
    first: dict[tuple[int, str], int] = {}  # (pid, device) -> the index of its first QP
    for i, qp in enumerate(qps):
        if not qp.kernel and len(first) < MAX_LISTED_QPS:
            first.setdefault((qp.pid or 0, qp.device), i)
    room = MAX_LISTED_QPS - len(first)  # for QPs past each process's first
    listed: list[dict[str, Any]] = []
    last: dict[tuple[int, str], dict[str, Any]] = {}  # a process's last listed QP, by device
    counts: dict[tuple[int, str], int] = {}
    dropped = 0
    for i, qp in enumerate(qps):
        if qp.kernel:
            listed.append(qp.fields())
            continue
        owner = (qp.pid or 0, qp.device)
        count = counts[owner] = counts.get(owner, 0) + 1
        if first.get(owner) == i or (
            owner in first and count <= MAX_LISTED_PER_PROCESS and room > 0
        ):
            room -= first.get(owner) != i
            listed.append(fields := qp.fields())
            last[owner] = fields
        elif owner in last:  # counted on the process's last listed QP of the device
            fields = last[owner]
            fields["rdma.qp.not_listed"] = fields.get("rdma.qp.not_listed", 0) + 1
        else:  # a process past MAX_LISTED_QPS distinct ones
            dropped += 1
    return listed, dropped


def run_rdma_tool(timeout_s: float = TIMEOUT_S) -> str:
    """Run `rdma -j res show qp`; SensorUnavailable when the tool or its netlink is missing."""
    try:
        done = subprocess.run(
            COMMAND,
            capture_output=True,
            encoding="utf-8",
            errors="surrogateescape",  # a comm that is not UTF-8 is escaped per QP
            timeout=timeout_s,
            check=False,
        )
    except FileNotFoundError:
        raise SensorUnavailable("iproute2 `rdma` tool not found") from None
    except subprocess.TimeoutExpired:
        raise TimeoutError(f"`{' '.join(COMMAND)}` did not finish in {timeout_s:g} s") from None
    if done.returncode != 0:
        reason = (
            done.stderr.strip().splitlines()[-1]
            if done.stderr.strip()
            else (f"exit status {done.returncode}")
        )
        raise SensorUnavailable(f"`{' '.join(COMMAND)}` failed: {reason}")
    return done.stdout


class RdmaQpSensor:
    name = NAME

    def collect(self, ctx: SensorContext) -> list[Event]:
        text = ctx.raw_input(INPUT_NAME, run_rdma_tool)
        if text is None:
            raise SensorUnavailable(f"no {INPUT_NAME} in this sample")
        parsed = parse_qp_output(text)
        listed, dropped = bounded(parsed.qps)
        events = [
            new_event("rdma_qp", "sample", NAME, ctx.host_name, ctx.timestamp, fields)
            for fields in listed
        ]
        if dropped:
            events.append(
                ctx.status(
                    NAME,
                    "dropped",
                    f"{dropped} users' QPs past the {MAX_LISTED_QPS} a sample lists",
                    **{"hpcsec.dropped": dropped},
                )
            )
        if parsed.errors:
            events.append(
                ctx.status(
                    NAME,
                    "dropped",
                    f"{len(parsed.errors)} QP records skipped as malformed",
                    **{"hpcsec.parse_errors": list(parsed.errors[:MAX_REPORTED_ERRORS])},
                )
            )
        return events

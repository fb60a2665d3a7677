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

QPs need no privilege, and a node with 8 HCAs allows millions (~200 bytes of JSON each), so
the output is never held whole: it is read as it arrives (`rdma_output`), split into records
one at a time (`QpRecords`), and only what can still be listed is kept (`Selection`, the
bounds below). A sample stops at MAX_RECORDS records or MAX_OUTPUT_CHARS characters (the
tool is killed and a `dropped` status says so), and a record longer than MAX_RECORD_CHARS is
not iproute2's (QpOutputError).
"""

from __future__ import annotations

import codecs
import json
import os
import re
import selectors
import subprocess
import time
from collections.abc import Generator, Iterable, Iterator
from dataclasses import astuple, dataclass
from typing import Any

import orjson

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
# every process's first one before any other's second (`Selection`). Kernel QPs (storage
# clients, IPoIB) are no user's to multiply.
MAX_LISTED_PER_PROCESS = 256
MAX_LISTED_QPS = 32768
# The work of one sample: 4 million records (~800 MB of JSON) is twice what 8 HCAs of 2^18
# QPs each allow; past it, or past MAX_OUTPUT_CHARS of output, the sample is cut and says so.
MAX_RECORDS = 4_000_000
MAX_OUTPUT_CHARS = 1 << 30
# An iproute2 record is under 1 KiB (a comm is 16 bytes, even escaped): a longer one means
# the output is not iproute2's, and nothing is buffered past it.
MAX_RECORD_CHARS = 1 << 16
CHUNK_BYTES = 1 << 18  # read from the tool at a time
STDERR_TAIL_BYTES = 4096  # of the tool's stderr, for its last line in the error


class QpOutputError(ValueError):
    """The whole output is unusable (not JSON, not a list of QPs)."""


@dataclass(frozen=True, slots=True)
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


# A QP's fields in QueuePair's order: what a record gives, before a QueuePair is made of the
# few that are listed
QpValues = tuple[Any, ...]
_DEVICE, _PID = 0, 10


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


def _checked_values(record: Any) -> QpValues:
    """The QP of one record, every key checked in turn; ValueError naming the bad key."""
    if not isinstance(record, dict):
        raise ValueError(f"not an object: {type(record).__name__}")
    for key in ("ifname", "lqpn", "type", "state"):
        if key not in record:
            raise ValueError(f"no {key}")
    return (
        _required_text(record, "ifname"),
        _uint(record, "port"),
        _required_uint(record, "lqpn"),
        _required_text(record, "type"),
        _required_text(record, "state"),
        _uint(record, "rqpn"),
        _uint(record, "sq-psn"),
        _uint(record, "rq-psn"),
        _text(record, "path-mig-state"),
        _uint(record, "pdn"),
        _uint(record, "pid"),
        _text(record, "comm"),
    )


def _plain_values(record: Any) -> QpValues | None:
    """The QP of a record whose every value is of its kind and ASCII (nothing to escape), in
    one expression: a million records a sample go through here. None for any other record,
    which `_checked_values` then reads (or says what is wrong with)."""
    if type(record) is not dict:
        return None
    get = record.get
    device, lqpn, qp_type, state = get("ifname"), get("lqpn"), get("type"), get("state")
    port, rqpn, sq_psn, rq_psn = get("port"), get("rqpn"), get("sq-psn"), get("rq-psn")
    mig, pdn, pid, comm = get("path-mig-state"), get("pdn"), get("pid"), get("comm")
    if (
        type(device) is str
        and device.isascii()
        and device
        and type(lqpn) is int
        and 0 <= lqpn <= U32_MAX
        and type(qp_type) is str
        and qp_type.isascii()
        and qp_type
        and type(state) is str
        and state.isascii()
        and state
        and (port is None or (type(port) is int and 0 <= port <= U32_MAX))
        and (rqpn is None or (type(rqpn) is int and 0 <= rqpn <= U32_MAX))
        and (sq_psn is None or (type(sq_psn) is int and 0 <= sq_psn <= U32_MAX))
        and (rq_psn is None or (type(rq_psn) is int and 0 <= rq_psn <= U32_MAX))
        and (mig is None or (type(mig) is str and mig.isascii() and mig))
        and (pdn is None or (type(pdn) is int and 0 <= pdn <= U32_MAX))
        and (pid is None or (type(pid) is int and 0 <= pid <= U32_MAX))
        and (comm is None or (type(comm) is str and comm.isascii() and comm))
    ):
        return (device, port, lqpn, qp_type, state, rqpn, sq_psn, rq_psn, mig, pdn, pid, comm)
    return None


def qp_values(record: Any) -> QpValues:
    """The QP of one record of the output; ValueError naming the bad key."""
    return _plain_values(record) or _checked_values(record)


def qp_from_record(record: Any) -> QueuePair:
    """One QP object of the JSON output; ValueError naming the bad key."""
    return QueuePair(*qp_values(record))


# iproute2 before 7.0 writes a comm's control bytes raw, and 5.3-6.0 write `'` as `\'`:
# neither is JSON, and one process's name must not blank every QP of the node
_ESCAPED_QUOTE = re.compile(r"(?<!\\)((?:\\\\)*)\\'")
_JSON_SPACE = " \t\n\r"
_JSON_SPACES = re.compile(r"[ \t\n\r]*+")
_SPACES = re.compile(r"\s*+")  # str.strip's white space, found without copying the text
# A JSON value's tokens, to find where a record that is not a plain object ends: a string
# (a lone `"` when it does not end in the text scanned), a run of other characters, or one
# of `[]{},`; possessive, so a hostile record is scanned once
_TOKEN = re.compile(r'"(?:[^"\\]++|\\.)*+"|[^"\[\]{},]++|.', re.DOTALL)
_AFTER_RECORD = (",", "]")


def _reference_json(text: str) -> Any:
    """One record read as the whole output used to be: `\\'` and raw control characters
    accepted, and any integer kept exact (orjson reads one past 64 bits as a float)."""
    try:
        return json.loads(_ESCAPED_QUOTE.sub(r"\1'", text), strict=False)
    except json.JSONDecodeError as exc:
        raise ValueError(f"not JSON: {exc.msg}") from None
    except RecursionError:
        raise ValueError("not JSON: nested too deeply") from None


def _reference_qp(record: str) -> QpValues | ValueError:
    """The QP of one record of the JSON list as the reference parse reads it, or why not."""
    try:
        return qp_values(_reference_json(record))
    except ValueError as exc:
        return exc


def _orjson_qp(record: str) -> QpValues | ValueError | None:
    """The QP of one record of the JSON list, or why not; None when orjson cannot read it.
    orjson's values are those of the reference parse for every record that is a QP (its
    strings hold no surrogates, nothing to escape); for one that is not, the reference
    parse says why, as it did for the whole output (orjson reads an integer past 64 bits as
    a float)."""
    try:
        value = orjson.loads(record)
    except orjson.JSONDecodeError:
        return None
    qp = _plain_values(value)
    if qp is not None:
        return qp
    try:
        return _checked_values(value)  # a name that is not ASCII
    except ValueError:
        return _reference_qp(record)


def _value_end(text: str, start: int, stop: int) -> int:
    """Where the JSON value at `start` ends: the index of the `,`, `]` or `}` after it at
    its own depth; -1 when that is not before `stop`."""
    depth = 0
    for token in _TOKEN.finditer(text, start, stop):
        first = text[token.start()]
        if first == '"':
            if token.end() - token.start() == 1:
                return -1  # a string that does not end before `stop`
        elif first in "[{":
            depth += 1
        elif first in "]},":
            if depth == 0:
                return token.start()
            if first != ",":
                depth -= 1
    return -1


class _OutputCut(Exception):
    """The output is longer than a sample reads (MAX_OUTPUT_CHARS)."""


class _Output:
    """The output's text as it arrives: a buffer that holds the record being read and the
    chunk it is in (the text before it is let go), and the chunks still to come."""

    def __init__(self, chunks: Iterator[str]):
        self._chunks = chunks
        self.text = ""
        self._read = 0  # characters

    def more(self, keep_from: int) -> bool:
        """Drops the text before `keep_from` and appends the next chunk; False at the end,
        _OutputCut past MAX_OUTPUT_CHARS."""
        for chunk in self._chunks:
            if chunk:
                self._read += len(chunk)
                if self._read > MAX_OUTPUT_CHARS:
                    raise _OutputCut
                self.text = self.text[keep_from:] + chunk
                return True
        self.text = self.text[keep_from:]
        return False


def _truncated(text: str, number: int) -> QpOutputError:
    """The error for an output that ends inside record `number` (whose text is `text`)."""
    try:
        _reference_json(text)
        why = "Expecting ',' delimiter"  # a whole record, and the list not closed after it
    except ValueError as exc:
        why = str(exc).removeprefix("not JSON: ")
    return QpOutputError(f"{INPUT_NAME}: not JSON: {why} (the output ends in record {number})")


def _too_long(number: int) -> QpOutputError:
    return QpOutputError(
        f"{INPUT_NAME}: record {number} is longer than {MAX_RECORD_CHARS} characters: "
        "not iproute2's output"
    )


class QpRecords:
    """The QP of each record of an output given in chunks (a ValueError saying why for a
    record that is not one), read one record at a time: what is held is the record being
    read, never the output. `form` is "json" or "text", or None to tell by the output (JSON
    when it starts with `[` or `{`). QpOutputError when the output is not a JSON list or
    not iproute2's. The reading stops after MAX_RECORDS records or MAX_OUTPUT_CHARS
    characters, and `cut` says which."""

    def __init__(self, chunks: Iterable[str], form: str | None = None):
        self._output = _Output(iter(chunks))
        self._form = form
        self.records = 0
        self.cut: str | None = None

    def __iter__(self) -> Iterator[QpValues | ValueError]:
        try:
            yield from self._records()
        except _OutputCut:
            self.cut = f"more than {MAX_OUTPUT_CHARS} characters"

    def _records(self) -> Iterator[QpValues | ValueError]:
        output = self._output
        while (start := _SPACES.match(output.text).end()) == len(output.text):  # type: ignore[union-attr]
            # only white space so far: no QPs, or what comes before them (the text form's
            # lines are kept whole, a blank one being no record)
            keep_from = output.text.rfind("\n") + 1
            if len(output.text) - keep_from > MAX_RECORD_CHARS:
                raise _too_long(1)
            if not output.more(keep_from):
                return
        first = output.text[start]
        if (self._form or ("json" if first in "[{" else "text")) == "text":
            yield from self._text_records()
        elif first == "[":
            yield from self._json_records(start + 1)
        else:
            raise self._not_a_list(start)

    def _counted(self) -> bool:
        """Counts one more record; False (and `cut` set) past MAX_RECORDS."""
        if self.records >= MAX_RECORDS:
            self.cut = f"more than {MAX_RECORDS} records"
            return False
        self.records += 1
        return True

    def _json_records(self, pos: int) -> Iterator[QpValues | ValueError]:
        """The elements of the JSON list opened just before `pos` of the text.

        The usual record, an object without nesting, is cut at its first `}`, and orjson's
        reading it whole proves the cut (a `}` in a string or a nested object leaves the text
        unreadable); any other element is delimited by its tokens (`_value_end`) and read by
        the reference parse."""
        output = self._output
        text = output.text
        while True:
            if pos < len(text) and text[pos] in _JSON_SPACE:
                pos = _JSON_SPACES.match(text, pos).end()  # type: ignore[union-attr]
            if pos == len(text):
                if not output.more(pos):
                    raise _truncated("", self.records + 1)
                text, pos = output.text, 0
                continue
            if not self.records and text[pos] == "]":
                end = pos  # an empty list
                break
            end = text.find("}", pos, pos + MAX_RECORD_CHARS) + 1
            if end and text[pos] == "{" and text[end : end + 1] in _AFTER_RECORD:
                qp = _orjson_qp(text[pos:end])
                tried = end
            else:
                qp, tried = None, -1
            if qp is None:
                end = _value_end(text, pos, pos + MAX_RECORD_CHARS + 1)
                if end < 0:  # the element goes on past the text read
                    if len(text) - pos > MAX_RECORD_CHARS:
                        raise _too_long(self.records + 1)
                    if not output.more(pos):
                        raise _truncated(output.text, self.records + 1)
                    text, pos = output.text, 0
                    continue
                if end != tried:  # a `}` in a string, or white space after the record
                    qp = _orjson_qp(text[pos:end])
                if qp is None:
                    qp = _reference_qp(text[pos:end])
            if not self._counted():
                return
            yield qp
            if text[end] != ",":
                break
            pos = end + 1
        if text[end] == "}":
            raise QpOutputError(
                f"{INPUT_NAME}: not JSON: '}}' after record {self.records}, not ',' or ']'"
            )
        self._expect_end(end + 1)

    def _expect_end(self, pos: int) -> None:
        """Only white space may follow the list; it is read to its end (the tool's exit
        status comes after it)."""
        output = self._output
        while True:
            if _JSON_SPACES.match(output.text, pos).end() < len(output.text):  # type: ignore[union-attr]
                raise QpOutputError(f"{INPUT_NAME}: not JSON: Extra data after the list")
            if not output.more(len(output.text)):
                return
            pos = 0

    def _not_a_list(self, start: int) -> QpOutputError:
        """The error for JSON that does not start with `[` (at `start` of the text)."""
        output = self._output
        while len(output.text) - start <= MAX_RECORD_CHARS:
            more = output.more(start)
            start = 0
            if not more:
                break
        if len(output.text) - start > MAX_RECORD_CHARS:
            return QpOutputError(f"{INPUT_NAME}: expected a JSON list")
        try:
            value = _reference_json(output.text[start:])
        except ValueError as exc:
            return QpOutputError(f"{INPUT_NAME}: {exc}")
        return QpOutputError(f"{INPUT_NAME}: expected a JSON list, got {type(value).__name__}")

    def _text_records(self) -> Iterator[QpValues | ValueError]:
        """The lines of the text form, one QP each (blank lines are none)."""
        output = self._output
        text, pos = output.text, 0
        while True:
            # not splitlines: a comm may hold `\r` (procinfo)
            end = text.find("\n", pos, pos + MAX_RECORD_CHARS + 1)
            if end < 0:
                if len(text) - pos > MAX_RECORD_CHARS:
                    raise _too_long(self.records + 1)
                if output.more(pos):
                    text, pos = output.text, 0
                    continue
                text, pos, end = output.text, 0, len(output.text)  # the last line
            line = text[pos:end]
            if line.strip():
                if not self._counted():
                    return
                try:
                    qp: QpValues | ValueError = qp_values(_text_record(line))
                except ValueError as exc:
                    qp = exc
                yield qp
            if end == len(text):
                return
            pos = end + 1


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


def _parse_all(records: QpRecords) -> QpParse:
    qps, errors = [], []
    for number, qp in enumerate(records, 1):
        if isinstance(qp, ValueError):
            errors.append(f"record {number}: {qp}")
        else:
            qps.append(QueuePair(*qp))
    return QpParse(tuple(qps), tuple(errors))


# Every QP of a (small, saved) output, for tests and tools: a sample reads with `read_qps`.
def parse_qp_json(text: str) -> QpParse:
    """`rdma -j res show qp` output; QpOutputError if it is not a JSON list."""
    return _parse_all(QpRecords([text], "json"))


def parse_qp_text(text: str) -> QpParse:
    """`rdma res show qp` text output, one QP per line."""
    return _parse_all(QpRecords([text], "text"))


def parse_qp_output(text: str) -> QpParse:
    """JSON when it looks like JSON, else the text form."""
    return _parse_all(QpRecords([text]))


class Selection:
    """The QPs a sample lists, chosen in one pass over the output, holding only those.

    Kernel QPs are all listed. Of users' QPs, the first of each process on a device (an
    owner) is listed, up to MAX_LISTED_QPS owners; the QPs of owners past those are dropped
    (counted). An owner's others are listed in output order while they are at most
    MAX_LISTED_PER_PROCESS of it and the sample has room: MAX_LISTED_QPS less the owners at
    the end. So no process can hide another's QPs by having many of its own (filling the
    room before the other's came in the output). The room only shrinks as owners come, so
    the others listed so far are kept in order and the last ones let go when a new owner
    leaves too little. An owner's listed QPs are the first ones it has in the output, so
    its last listed one, which counts the others in `rdma.qp.not_listed`, is known at the
    end."""

    def __init__(self) -> None:
        self._listed: list[QueuePair | None] = []  # in output order; None: let go
        self._others: list[int] = []  # where in _listed the listed non-first QPs are
        self._owners: dict[tuple[int, str], list[int]] = {}  # -> [QPs, QPs listed]
        self.dropped = 0

    def add(self, qp: QpValues) -> None:
        """One more QP of the output (QueuePair's fields, in its order)."""
        pid = qp[_PID]
        if not pid:  # a kernel QP
            self._listed.append(QueuePair(*qp))
            return
        owner = (pid, qp[_DEVICE])
        counts = self._owners.get(owner)
        if counts is None:
            if len(self._owners) >= MAX_LISTED_QPS:
                self.dropped += 1
                return
            self._owners[owner] = [1, 1]
            self._let_go(MAX_LISTED_QPS - len(self._owners))
            self._listed.append(QueuePair(*qp))
            return
        counts[0] += 1
        room = MAX_LISTED_QPS - len(self._owners)  # for others than the owners' first
        if counts[0] <= MAX_LISTED_PER_PROCESS and len(self._others) < room:
            counts[1] += 1
            self._others.append(len(self._listed))
            self._listed.append(QueuePair(*qp))

    def _let_go(self, room: int) -> None:
        """Unlists the last non-first QPs past `room`."""
        while len(self._others) > room:
            at = self._others.pop()
            qp = self._listed[at]
            assert qp is not None and qp.pid  # only users' QPs are in _others
            self._listed[at] = None
            self._owners[(qp.pid, qp.device)][1] -= 1

    def fields(self) -> list[dict[str, Any]]:
        """The fields of the listed QPs, in output order, each owner's last listed one with
        `rdma.qp.not_listed` when it has QPs that are not."""
        listed: list[dict[str, Any]] = []
        last_seen: set[tuple[int, str]] = set()
        for qp in reversed(self._listed):
            if qp is None:
                continue
            listed.append(fields := qp.fields())
            if qp.kernel:
                continue
            owner = (qp.pid or 0, qp.device)
            if owner not in last_seen:
                last_seen.add(owner)
                seen, shown = self._owners[owner]
                if seen > shown:
                    fields["rdma.qp.not_listed"] = seen - shown
        listed.reverse()
        return listed


def bounded(qps: Iterable[QueuePair]) -> tuple[list[dict[str, Any]], int]:
    """The fields of the QPs to list, in output order, and how many users' QPs were dropped
    (`Selection`)."""
    selection = Selection()
    for qp in qps:
        selection.add(astuple(qp))
    return selection.fields(), selection.dropped


@dataclass(frozen=True)
class QpSample:
    listed: list[dict[str, Any]]  # the fields of the QPs listed
    dropped: int  # users' QPs of owners past MAX_LISTED_QPS
    errors: int  # records skipped as malformed
    first_errors: tuple[str, ...]  # "record N: why", the first MAX_REPORTED_ERRORS
    records: int  # records read
    cut: str | None  # why the output was not read to its end


def read_qps(chunks: Iterable[str]) -> QpSample:
    """A sample's QPs from the output in chunks (`rdma_output`, or a snapshot's text); the
    chunks are closed (the tool killed) when the reading stops before their end."""
    source = iter(chunks)
    records = QpRecords(source)
    selection = Selection()
    errors: list[str] = []
    skipped = 0
    try:
        for number, qp in enumerate(records, 1):
            if isinstance(qp, ValueError):
                skipped += 1
                if len(errors) < MAX_REPORTED_ERRORS:
                    errors.append(f"record {number}: {qp}")
            else:
                selection.add(qp)
    finally:
        close = getattr(source, "close", None)
        if close is not None:
            close()
    return QpSample(
        selection.fields(),
        selection.dropped,
        skipped,
        tuple(errors),
        records.records,
        records.cut,
    )


def _last_line(stderr: bytes) -> str | None:
    text = stderr.decode("utf-8", "surrogateescape").strip()
    return text.splitlines()[-1] if text else None


class _Waiting:
    """The time the tool may keep the sensor waiting, in all. The time spent on its output
    between reads is the sensor's, not the tool's: under the agent's CPU quota, reading a
    large output takes longer than printing it, and the reading is bounded by its own caps
    (MAX_RECORDS, MAX_OUTPUT_CHARS)."""

    def __init__(self, timeout_s: float):
        self.timeout_s = timeout_s
        self.left = timeout_s

    def expired(self) -> TimeoutError:
        return TimeoutError(f"`{' '.join(COMMAND)}` did not finish in {self.timeout_s:g} s")

    def select(self, pipes: selectors.BaseSelector) -> list[tuple[selectors.SelectorKey, int]]:
        if self.left <= 0:
            raise self.expired()
        start = time.monotonic()
        try:
            return pipes.select(self.left)
        finally:
            self.left -= time.monotonic() - start

    def exit_status(self, proc: subprocess.Popen) -> int:
        try:
            return proc.wait(max(self.left, 0))
        except subprocess.TimeoutExpired:
            raise self.expired() from None


def _chunks(proc: subprocess.Popen, waiting: _Waiting) -> Generator[str, None, bytes]:
    """The tool's stdout as text, as it comes; returns the tail of its stderr, which is read
    beside (a tool blocked writing to a full stderr pipe would never end)."""
    decoder = codecs.getincrementaldecoder("utf-8")("surrogateescape")
    stderr = b""
    with selectors.DefaultSelector() as pipes:
        pipes.register(proc.stdout, selectors.EVENT_READ)  # type: ignore[arg-type]
        pipes.register(proc.stderr, selectors.EVENT_READ)  # type: ignore[arg-type]
        while pipes.get_map():
            for key, _ in waiting.select(pipes):
                data = os.read(key.fd, CHUNK_BYTES)
                if not data:
                    pipes.unregister(key.fileobj)
                elif key.fileobj is proc.stderr:
                    stderr = (stderr + data)[-STDERR_TAIL_BYTES:]
                elif text := decoder.decode(data):
                    yield text
    if text := decoder.decode(b"", final=True):
        yield text
    return stderr


def rdma_output(timeout_s: float = TIMEOUT_S) -> Iterator[str]:
    """Run `rdma -j res show qp` and yield its output as it comes, in chunks of text (bytes
    that are not UTF-8 kept by surrogateescape: a comm is escaped per QP). SensorUnavailable
    when the tool or its netlink is missing (at the end: the exit status comes last),
    TimeoutError when the tool has kept us waiting `timeout_s` in all (`_Waiting`). Closing
    the iterator before its end kills the tool."""
    try:
        proc = subprocess.Popen(COMMAND, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    except FileNotFoundError:
        raise SensorUnavailable("iproute2 `rdma` tool not found") from None
    waiting = _Waiting(timeout_s)
    try:
        stderr = yield from _chunks(proc, waiting)
        returncode = waiting.exit_status(proc)
        if returncode != 0:
            reason = _last_line(stderr) or f"exit status {returncode}"
            raise SensorUnavailable(f"`{' '.join(COMMAND)}` failed: {reason}")
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        for pipe in (proc.stdout, proc.stderr):
            if pipe is not None:
                pipe.close()


class RdmaQpSensor:
    name = NAME

    def collect(self, ctx: SensorContext) -> list[Event]:
        chunks = ctx.raw_chunks(INPUT_NAME, rdma_output)
        if chunks is None:
            raise SensorUnavailable(f"no {INPUT_NAME} in this sample")
        sample = read_qps(chunks)
        events = [
            new_event("rdma_qp", "sample", NAME, ctx.host_name, ctx.timestamp, fields)
            for fields in sample.listed
        ]
        if sample.dropped:
            events.append(
                ctx.status(
                    NAME,
                    "dropped",
                    f"{sample.dropped} users' QPs past the {MAX_LISTED_QPS} a sample lists",
                    **{"hpcsec.dropped": sample.dropped},
                )
            )
        if sample.errors:
            events.append(
                ctx.status(
                    NAME,
                    "dropped",
                    f"{sample.errors} QP records skipped as malformed",
                    **{"hpcsec.parse_errors": list(sample.first_errors)},
                )
            )
        if sample.cut:  # what came after is unseen: the status says so, and raises an alert
            events.append(
                ctx.status(
                    NAME,
                    "dropped",
                    f"QP output cut after {sample.records} records ({sample.cut}): the QPs "
                    "after them are neither listed nor counted",
                )
            )
        return events

"""Who a pid is: name, executable, command line, parent and user, read through ctx.proc/ctx.etc.

Shared by every sensor that sees a pid (processes, NVML processes, sockets, file accesses,
RDMA queue pairs). Every read goes through the context's roots, so a snapshot records the
`proc/<pid>/…` files and the node's `etc/passwd`, and a replay names users from the node's
passwd, not from the machine that replays it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from hpcsec.detector.core.text import from_node_bytes
from hpcsec.sensors import cmdline_condense, proclists, stalls, subuids
from hpcsec.sensors.base import FsRoot, SensorContext
from hpcsec.sensors.cmdline_budget import CommandLineBudget

# Read sizes: a read buffer is allocated at its full size, and these files are read for every
# process of every sample. status is ~1.5 KiB. cmdline and environ are read whole, in bounded
# chunks (sensors/proclists.py): their owner chooses their length.
STATUS_MAX = 16 * 1024
CMDLINE_MAX = cmdline_condense.CMDLINE_MAX
# The environment variables any part of hpcsec reads; nothing else of an environment is kept.
ENVIRON_KEYS = ("LD_PRELOAD", "SLURM_JOB_ID", "SLURM_STEP_ID", "CUDA_VISIBLE_DEVICES")
# glibc's ld.so loads the last LD_PRELOAD of an environment, musl's the first (getenv): both
# are kept, and read as one list, every library of which must be allowed
EVERY_LOADER = ("LD_PRELOAD",)


@dataclass(frozen=True)
class Users:
    """uid -> name from the node's passwd (the first entry of a uid wins, as getpwuid)."""

    names: dict[int, str] = field(default_factory=dict)

    @classmethod
    def parse(cls, text: str) -> Users:
        names: dict[int, str] = {}
        for line in text.split("\n"):  # as getpwent: a GECOS with `\r` stays in its line
            if line.startswith("#"):
                continue
            parts = line.split(":")
            if len(parts) >= 3 and parts[0] and parts[2].isdigit():
                names.setdefault(int(parts[2]), parts[0])
        return cls(names)

    @classmethod
    def load(cls, etc: FsRoot) -> Users:
        return cls.parse(etc.read_text("passwd") or "")

    def name(self, uid: int | None) -> str | None:
        return None if uid is None else self.names.get(uid)


PROCESS_STATUS_KEYS = frozenset({"Name", "PPid", "Uid"})  # what process_fields reads
OWNER_KEYS = frozenset({"Uid"})
RANGES_TTL_S = 1.0  # owner_key's ranges and node namespace, kept at most this long


def status_fields(text: str, keys: frozenset[str] | None = None) -> dict[str, str]:
    """`Key:\tvalue` lines of /proc/<pid>/status, values stripped; with `keys`, those only,
    read up to the last of them (the kernel writes Name, PPid and Uid in its first lines,
    and the 50 after them cost as much again).

    Lines end at `\n` only: Name is the process's own comm, in which the kernel escapes `\n`
    but not `\r`, `\v`, `\f` or `\x1c`-`\x1e`, where str.splitlines also breaks; a comm of
    `\rUid:\t0` would otherwise be a line of its own, before the real one."""
    out = {}
    for line in text.split("\n"):
        key, sep, value = line.partition(":")
        if sep and (keys is None or key in keys):
            out[key] = value.strip()
            if keys is not None and len(out) == len(keys):
                break
    return out


def environ_value(environ: bytes | None, var: str) -> str | None:
    """The value of `var` in a NUL-separated /proc/<pid>/environ (as read_environ keeps it),
    or None: the first entry, as getenv reads it; for EVERY_LOADER names, every entry kept,
    joined by `:` as ld.so separates libraries."""
    prefix = var.encode() + b"="
    values = [
        from_node_bytes(entry[len(prefix) :])
        for entry in (environ or b"").split(b"\0")
        if entry.startswith(prefix)
    ]
    if not values:
        return None
    return ":".join(dict.fromkeys(values)) if var in EVERY_LOADER else values[0]


def read_environ(proc: FsRoot, pid: int | str, owner: int | None = None) -> bytes | None:
    """The ENVIRON_KEYS entries of a process's environment, wherever they sit in it; None
    when it cannot be read, or a read of the process's memory is stuck (stalls.py).
    `owner`: who answers for the process (owner_key), when the caller knows; else its real
    uid, read first."""
    if owner is None:
        owner = owner_uid(proc, int(pid))
    try:
        return stalls.guarded(
            int(pid),
            lambda: proc.read_condensed(
                f"{pid}/environ",
                lambda stream: proclists.environ_entries(stream, ENVIRON_KEYS, EVERY_LOADER),
            ),
            lambda: start_time(proc, int(pid)),
            owner,
        )
    except (stalls.Quarantined, stalls.NoReader, stalls.OwnerStalled):
        return None


def _first_int(value: str | None) -> int | None:
    words = (value or "").split()
    return int(words[0]) if words and words[0].isdigit() else None


def users_of(ctx: SensorContext) -> Users:
    """The node's passwd, read once per sample (cached in ctx.state by the sample's time)."""
    cached = ctx.state.get("etc/passwd")
    if cached is not None and cached[0] == ctx.timestamp:
        return cached[1]
    users = Users.load(ctx.etc)
    ctx.state["etc/passwd"] = (ctx.timestamp, users)
    return users


def process_fields(
    ctx: SensorContext,
    pid: int,
    users: Users | None = None,
    budget: CommandLineBudget | None = None,
) -> dict[str, Any]:
    """process.* and user.* fields of `pid`; {} when the process is gone (or not visible).

    A kernel thread has an empty cmdline: it gets no `process.command_line`; nor does a
    process a read of whose memory is stuck, marked `process.memory_read_stalled`, or one
    whose owner's other processes hang such reads, marked `process.memory_read_skipped`
    (stalls.py).
    Every string is
    event text (core/text): a name or argument that is not UTF-8 keeps its bytes as `\\xNN`.
    `budget`: the sample's command lines per owner (the process sensor's: cmdline_budget.py).
    """
    base = str(pid)
    status = ctx.proc.read_text(f"{base}/status", STATUS_MAX)
    if status is None:
        return {}
    values = status_fields(status, PROCESS_STATUS_KEYS)
    comm = ctx.proc.read_text(f"{base}/comm", 64)
    fields: dict[str, Any] = {
        "process.pid": pid,
        "process.name": comm.rstrip("\n") if comm is not None else values.get("Name"),
        "process.executable": ctx.proc.readlink(f"{base}/exe"),
        "process.parent.pid": _first_int(values.get("PPid")),
    }
    uid = _first_int(values.get("Uid"))  # real uid: the first of real, effective, saved, fs
    try:
        cmdline = stalls.guarded(
            pid,
            lambda: ctx.proc.read_condensed(
                f"{base}/cmdline",
                lambda stream: cmdline_condense.cmdline(stream, ctx.cmdline_literals),
            ),
            lambda: start_time(ctx.proc, pid),
            owner_key(ctx, pid, uid),
        )
    except stalls.Quarantined:  # its arguments sit on a file system that does not answer
        cmdline = None
        fields["process.memory_read_stalled"] = True
    except stalls.OwnerStalled:  # other processes of its owner hang the reads
        cmdline = None
        fields["process.memory_read_skipped"] = True
    except stalls.NoReader:  # another process's read is stuck: nothing known of this one
        cmdline = None
    if cmdline:
        # each argument decoded on its own: an odd byte stays `\xNN` in its own argument
        raw = cmdline.rstrip(b"\0").split(b"\0")
        if budget is None:
            args, short = [from_node_bytes(arg) for arg in raw], False
        else:
            args, short = budget.args(owner_key(ctx, pid, uid), raw)
        fields["process.args"] = args
        fields["process.command_line"] = " ".join(args)
        if short or cmdline_condense.is_condensed(args):  # rules still saw what they look for
            fields["process.command_line_truncated"] = True
    if uid is not None:
        fields["user.id"] = uid
        fields["user.name"] = (users or users_of(ctx)).name(uid)
    return {k: v for k, v in fields.items() if v is not None}


def owner_key(ctx: SensorContext, pid: int, uid: int | None) -> int | None:
    """Who answers for a process in the bounds of stalls.py: its real uid, or, for a process
    of a rootless container (a user namespace other than the node's) running as a
    subordinate uid, the user the uid's range belongs to (subuids.py). The ranges and the
    node's namespace are read once per sample; a process's own namespace only for a uid in
    a range."""
    if uid is None:
        return None
    ranges, node_namespace = _ranges_of(ctx)
    owner = ranges.owner(uid)
    if owner == uid:
        return uid
    own = ctx.proc.readlink(f"{pid}/ns/user")
    contained = own is not None and node_namespace is not None and own != node_namespace
    return owner if contained else uid


def _ranges_of(ctx: SensorContext) -> tuple[subuids.Subordinates, str | None]:
    """The node's subordinate ranges and its initial user namespace (init's, else this
    process's where /proc/1 is hidden), cached in ctx.state for the sample (and for at most
    RANGES_TTL_S: the file-access watch keeps one context for its whole run)."""
    cached = ctx.state.get("etc/subuid")
    now = time.monotonic()
    if cached is not None and cached[0] == ctx.timestamp and now - cached[3] < RANGES_TTL_S:
        return cached[1], cached[2]
    ranges = subuids.current(ctx.etc)
    node_namespace = ctx.proc.readlink("1/ns/user") or ctx.proc.readlink("self/ns/user")
    ctx.state["etc/subuid"] = (ctx.timestamp, ranges, node_namespace, now)
    return ranges, node_namespace


def owner_uid(proc: FsRoot, pid: int) -> int | None:
    """The real uid of a process, from /proc/<pid>/status (not its memory)."""
    status = proc.read_text(f"{pid}/status", STATUS_MAX)
    return _first_int(status_fields(status, OWNER_KEYS).get("Uid")) if status else None


def start_time(proc: FsRoot, pid: int) -> int | None:
    """Field 22 of /proc/<pid>/stat (clock ticks after boot): with the pid, it names one
    process, whereas a pid alone is reused. The name (field 2) may hold spaces and `)`, so
    the fields are counted from its last `)`."""
    stat = proc.read_bytes(f"{pid}/stat", 4096)
    if not stat:
        return None
    fields = stat[stat.rfind(b")") + 1 :].split()
    # fields[0] is field 3 (state): field 22 is fields[19]
    return int(fields[19]) if len(fields) > 19 and fields[19].isdigit() else None

"""Build procfs/etc trees and node snapshots in kernel layout, for sensor tests and fixtures.

node = NodeTree(tmp_path)
node.passwd(("root", 0), ("alice", 1001))
node.process(4242, "python3", ["python3", "train.py"], uid=1001, ppid=1,
             environ={"SLURM_JOB_ID": "77"}, fds={3: "/models/w.bin"})
ctx = node.context()                       # a SensorContext over the trees
tree = sample_tree(tmp_path / "snap", 0, "2026-11-30T10:00:00.000Z")  # then write_meta
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from hpcsec.sensors.base import FsRoot, SensorContext

STATUS = """Name:\t{name}
Umask:\t0022
State:\tS (sleeping)
Tgid:\t{pid}
Ngid:\t0
Pid:\t{pid}
PPid:\t{ppid}
TracerPid:\t0
Uid:\t{uid}\t{uid}\t{uid}\t{uid}
Gid:\t{gid}\t{gid}\t{gid}\t{gid}
FDSize:\t64
Threads:\t1
"""


class NodeTree:
    """proc/ and etc/ under `base`, filled one process at a time."""

    def __init__(self, base: str | Path):
        self.base = Path(base)
        self.proc = self.base / "proc"
        self.etc = self.base / "etc"
        self.sys = self.base / "sys"
        for d in (self.proc, self.etc, self.sys):
            d.mkdir(parents=True, exist_ok=True)

    def passwd(self, *users: tuple[str, int]) -> None:
        lines = [f"{name}:x:{uid}:{uid}::/home/{name}:/bin/sh" for name, uid in users]
        (self.etc / "passwd").write_text("\n".join(lines) + "\n")
        (self.etc / "group").write_text("\n".join(f"{name}:x:{uid}:" for name, uid in users) + "\n")

    def process(
        self,
        pid: int,
        name: str,
        argv: list[str],
        uid: int = 0,
        ppid: int = 1,
        exe: str | None = None,
        environ: dict[str, str] | None = None,
        cgroup: str = "0::/init.scope\n",
        fds: dict[int, str] | None = None,
    ) -> Path:
        """A /proc/<pid> entry in kernel format (argv [] makes a kernel thread)."""
        d = self.proc / str(pid)
        d.mkdir(parents=True, exist_ok=True)
        (d / "status").write_text(
            STATUS.format(name=name[:15], pid=pid, ppid=ppid, uid=uid, gid=uid)
        )
        (d / "comm").write_text(name[:15] + "\n")
        (d / "cmdline").write_bytes(b"".join(a.encode() + b"\0" for a in argv))
        (d / "environ").write_bytes(
            b"".join(f"{k}={v}".encode() + b"\0" for k, v in (environ or {}).items())
        )
        (d / "cgroup").write_text(cgroup)
        if exe is not None or argv:
            os.symlink(exe or argv[0], d / "exe")
        fd_dir = d / "fd"
        fd_dir.mkdir(exist_ok=True)
        for fd, target in (fds or {}).items():
            os.symlink(target, fd_dir / str(fd))
        return d

    def context(self, host_name: str = "node-test", config=None, **options) -> SensorContext:
        return SensorContext(
            host_name=host_name,
            sys=FsRoot("sys", self.sys),
            proc=FsRoot("proc", self.proc),
            etc=FsRoot("etc", self.etc),
            timestamp="2026-11-30T10:00:00.000Z",
            config=config,
            options=options,
        )


def write_snapshot(
    directory: str | Path, host_name: str, samples: list[dict[str, str | bytes]]
) -> Path:
    """A snapshot whose sample n holds `samples[n]` (relative path -> content)."""
    root = Path(directory)
    root.mkdir(parents=True, exist_ok=True)
    for n, files in enumerate(samples):
        for rel, content in files.items():
            path = root / str(n) / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            if isinstance(content, bytes):
                path.write_bytes(content)
            else:
                path.write_text(content)
    (root / "meta.json").write_text(
        json.dumps({"hpcsec.snapshot": 1, "host.name": host_name, "samples": len(samples)}) + "\n"
    )
    return root


def sample_tree(directory: str | Path, n: int, time: str) -> NodeTree:
    """Sample n of a snapshot as a NodeTree (write meta.json with `write_meta` at the end)."""
    tree = NodeTree(Path(directory) / str(n))
    (tree.base / "time").write_text(time + "\n")
    return tree


def write_meta(directory: str | Path, host_name: str, samples: int) -> None:
    (Path(directory) / "meta.json").write_text(
        json.dumps({"hpcsec.snapshot": 1, "host.name": host_name, "samples": samples}) + "\n"
    )

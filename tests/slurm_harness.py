"""A real single-host Slurm cluster for the integration tests (tests/slurm/*.sh do the work).

The cluster lives in its own directory under /tmp (config, state, logs, pid files, its own
munged and key) and listens on free ports, so it never touches /etc/slurm, /etc/munge, a
host's munged or a site cluster. `stop()` stops exactly the
daemons `start()` started, through their pid files.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

SCRIPTS = Path(__file__).resolve().parent / "slurm"
BINARIES = (
    "munged",
    "munge",
    "unmunge",
    "slurmctld",
    "slurmd",
    "sinfo",
    "scontrol",
    "squeue",
    "sbatch",
    "scancel",
    "runuser",
)
USERS = ("alice", "bob")


def unavailable_reason() -> str | None:
    """Why the cluster cannot run here (None when it can)."""
    if os.geteuid() != 0:
        return "needs root (starts munged, slurmctld, slurmd)"
    missing = [b for b in BINARIES if shutil.which(b) is None]
    if missing:
        return (
            "Slurm not installed (missing " + ", ".join(missing) + "): apt-get install "
            "slurmctld slurmd slurm-client munge, or `make system-deps`"
        )
    return None


def ensure_users() -> None:
    """Create the job users once; another test run creating them at the same time is fine."""
    for user in USERS:
        if subprocess.run(["id", user], capture_output=True).returncode != 0:
            subprocess.run(["useradd", "-m", user], capture_output=True)
            subprocess.run(["id", user], check=True, capture_output=True)


def free_ports(count: int) -> list[int]:
    """Ports nothing listens on now (the kernel's picks), so two clusters never collide."""
    holders = []
    try:
        for _ in range(count):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind(("", 0))
            holders.append(sock)
        return [sock.getsockname()[1] for sock in holders]
    finally:
        for sock in holders:
            sock.close()


@dataclass
class SlurmCluster:
    kit_dir: Path
    fake_gpus: int = 4
    hooks: bool = True
    node: str = field(default_factory=lambda: socket.gethostname().split(".")[0])
    ports: tuple[int, int] = field(default_factory=lambda: tuple(free_ports(2)))

    @property
    def conf(self) -> Path:
        return self.kit_dir / "etc" / "slurm.conf"

    @property
    def state_dir(self) -> Path:
        """--state-dir of the hpcsec prolog/epilog."""
        return self.kit_dir / "hpcsec-state"

    @property
    def env(self) -> dict[str, str]:
        return {**os.environ, "SLURM_CONF": str(self.conf), "KIT_DIR": str(self.kit_dir)}

    @classmethod
    def create(cls, **kwargs) -> SlurmCluster:
        kit = Path(tempfile.mkdtemp(prefix="hpcsec-slurm-", dir="/tmp"))
        kit.chmod(0o755)  # slurmctld runs as the slurm user and must reach its state dir
        return cls(kit, **kwargs)

    def _hook_script(self, name: str) -> Path:
        """Prolog=/Epilog= take a program without arguments: a wrapper passes ours."""
        hpcsec = Path(sys.executable).parent / "hpcsec"
        path = self.kit_dir / "hooks" / f"{name}.sh"
        path.parent.mkdir(mode=0o755, exist_ok=True)
        path.write_text(
            f"#!/bin/sh\nexport SLURM_CONF={self.conf}\n"
            f"exec {hpcsec} slurm {name} --state-dir {self.state_dir}\n"
        )
        path.chmod(0o755)
        return path

    def start(self) -> None:
        env = {
            **self.env,
            "FAKE_GPUS": str(self.fake_gpus),
            "CTLD_PORT": str(self.ports[0]),
            "SLURMD_PORT": str(self.ports[1]),
        }
        if self.hooks:
            env["PROLOG"] = str(self._hook_script("prolog"))
            env["EPILOG"] = str(self._hook_script("epilog"))
        proc = subprocess.run(
            [str(SCRIPTS / "start-slurm.sh")], env=env, capture_output=True, text=True, timeout=120
        )
        if proc.returncode != 0:
            raise RuntimeError(f"start-slurm.sh failed:\n{proc.stdout}\n{proc.stderr}")

    def stop(self) -> None:
        for user in USERS:
            self.run(["scancel", "-u", user], check=False)
        subprocess.run(
            [str(SCRIPTS / "stop-slurm.sh")],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=60,
        )

    # -------------------------------------------------------------- jobs
    def run(
        self, argv: list[str], user: str | None = None, check: bool = True, timeout: float = 30
    ) -> subprocess.CompletedProcess:
        if user is not None:
            argv = ["runuser", "-u", user, "--", *argv]
        return subprocess.run(
            argv,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=check,
            cwd="/tmp",
        )

    def sbatch(self, user: str, *args: str) -> str:
        out = self.run(
            [
                "sbatch",
                "--parsable",
                "-o",
                "/dev/null",
                "-e",
                "/dev/null",
                "--chdir",
                "/tmp",
                *args,
            ],
            user=user,
        ).stdout
        return out.strip().split(";")[0]

    def job(self, job_id: str) -> dict:
        doc = json.loads(self.run(["squeue", "--json"]).stdout)
        for job in doc["jobs"]:
            if str(job["job_id"]) == job_id:
                return job
        raise KeyError(job_id)

    def wait_state(self, job_id: str, states: tuple[str, ...], timeout: float = 30) -> str:
        deadline = time.monotonic() + timeout
        state = ""
        while time.monotonic() < deadline:
            state = self.job(job_id)["job_state"]
            if state in states:
                return state
            time.sleep(0.2)
        raise TimeoutError(f"job {job_id} is {state}, not {states} after {timeout}s")

    def pids(self, job_id: str) -> dict[int, str]:
        """pid -> step of a job's processes (`scontrol listpids <job>`)."""
        out = self.run(["scontrol", "listpids", job_id], check=False).stdout
        rows = [line.split() for line in out.splitlines()[1:]]
        return {int(r[0]): r[2] for r in rows if len(r) >= 3 and r[0].isdigit()}

    def wait_pids(self, job_id: str, step: str = "batch", timeout: float = 30) -> dict[int, str]:
        """The job's pids once its `step` has processes (the prolog runs first)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            pids = self.pids(job_id)
            if step in pids.values():
                return pids
            time.sleep(0.2)
        raise TimeoutError(f"job {job_id} has no {step} step processes after {timeout}s")

    def hook_events(self) -> list[dict]:
        path = self.state_dir / "slurm-events.jsonl"
        if not path.exists():
            return []
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]

    def wait_hook_event(self, job_id: str, action: str, timeout: float = 30) -> list[dict]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = [
                e
                for e in self.hook_events()
                if e.get("slurm.job.id") == job_id and e["event.action"] == action
            ]
            if found:
                return found
            time.sleep(0.2)
        raise TimeoutError(f"no {action} event for job {job_id} after {timeout}s")

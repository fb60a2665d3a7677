"""Test harness for `hpcsec agent` as a real process: a node tree the agent reads (procfs,
etc, rules, config), a signed webhook receiver, and the agent process itself."""

from __future__ import annotations

import hashlib
import hmac
import shutil
import signal
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import orjson
import pytest

SECRET = b"test-secret-0123456789"
SYSFS_FIXTURE = Path(__file__).resolve().parents[3] / "fixtures/sysfs/h100-4hca/sample0"
RULE_A_ID = "7d2b1c1e-0000-4000-8000-00000000000a"
RULE_B_ID = "7d2b1c1e-0000-4000-8000-00000000000b"
PASSWD = "root:x:0:0:root:/root:/bin/sh\n" + "".join(
    f"u{i}:x:{2000 + i}:{2000 + i}::/home/u{i}:/bin/sh\n" for i in range(1, 10)
)


def rule(rule_id: str, name: str, category: str = "process", field: str = "process.name") -> str:
    return f"""title: Test rule {name}
id: {rule_id}
status: test
logsource:
  product: hpc
  category: {category}
detection:
  selection:
    {field}: {name}
  condition: selection
level: high
"""


BROKEN_RULE = rule(RULE_A_ID, "cryptominer").replace(
    "condition: selection", "condition: selection and"
)


class Receiver:
    """A webhook receiver that checks the signature and records every alert id it got."""

    def __init__(self, port: int = 0):
        received: list[str] = []
        self.received = received
        self.bad_signatures = 0  # wrong HMAC, or an Idempotency-Key that is not alert.id
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers["Content-Length"])
                body = self.rfile.read(length)
                if len(body) < length:  # the agent was killed mid-request: not a post
                    return
                stamp = self.headers.get("X-Hpcsec-Timestamp", "")
                mac = hmac.new(SECRET, stamp.encode() + b"." + body, hashlib.sha256)
                if not hmac.compare_digest(
                    "sha256=" + mac.hexdigest(), self.headers.get("X-Hpcsec-Signature", "")
                ):
                    outer.bad_signatures += 1
                    self.send_response(401)
                    self.end_headers()
                    return
                alert = orjson.loads(body)
                if self.headers.get("Idempotency-Key") != alert["alert.id"]:
                    outer.bad_signatures += 1  # counted with them: the tests expect none
                received.append(alert["alert.id"])
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hook"

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class Node:
    """A procfs and etc tree the agent reads; the test adds and removes processes."""

    def __init__(self, root: Path):
        self.root = root
        self.proc = root / "proc"
        self.etc = root / "etc"
        self.rules = root / "rules"
        for d in (self.proc, self.etc, self.rules):
            d.mkdir(parents=True)
        (self.etc / "passwd").write_text(PASSWD)
        self.secret = root / "secret"
        self.secret.write_bytes(SECRET + b"\n")
        self.secret.chmod(0o600)  # the agent refuses a secret others can read
        self.alerts_file = root / "alerts.jsonl"
        self.spool = root / "spool"
        # One dedup window for the whole test: a process alerts once, whatever the clock.
        self.config = root / "site.yml"
        self.config.write_text("dedup_window_s: 86400\n")

    def start_process(self, pid: int, name: str, user: int) -> None:
        d = self.proc / str(pid)
        d.mkdir()
        uid = 2000 + user
        (d / "status").write_text(f"Name:\t{name}\nPPid:\t1\nUid:\t{uid}\t{uid}\t{uid}\t{uid}\n")
        (d / "cmdline").write_bytes(f"{name}\0--pool\0stratum+tcp://x\0".encode())
        (d / "comm").write_text(name + "\n")

    def end_process(self, pid: int) -> None:
        shutil.rmtree(self.proc / str(pid))

    def file_alerts(self) -> list[dict]:
        if not self.alerts_file.exists():
            return []
        return [
            orjson.loads(line)
            for line in self.alerts_file.read_bytes().splitlines()
            if line.strip()
        ]

    def spooled(self) -> list[str]:
        """Alert ids in the spool's segments (delivered lines included until the segment
        is deleted, which happens once all of its lines are delivered)."""
        return sorted(
            orjson.loads(line)["alert.id"]
            for seg in self.spool.glob("*/pending/*.jsonl")
            for line in seg.read_bytes().splitlines()
            if line.strip()
        )


class AgentProcess:
    def __init__(
        self,
        node: Node,
        *args: str,
        sensor: str = "process",
        procfs: str | None = None,
        file_output: bool = True,  # False: the outputs are the config's (`outputs:`)
    ):
        self.log = node.root / f"agent-{time.monotonic_ns()}.log"
        argv = [
            sys.executable,
            "-m",
            "hpcsec.detector",
            "agent",
            "--config",
            str(node.config),
            "--sensor",
            sensor,
            "--procfs-root",
            procfs or str(node.proc),
            "--etc-root",
            str(node.etc),
            "--no-default-rules",
            "--rules",
            str(node.rules),
            "--interval",
            "0.3",
            "--metrics-address",
            "127.0.0.1:0",
            "--spool",
            str(node.spool),
            "--webhook-secret-file",
            str(node.secret),
            *(["--output", f"file://{node.alerts_file}"] if file_output else []),
            *args,
        ]
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)
        line = wait_for(
            lambda: next(
                (ln for ln in self.text().splitlines() if "metrics at http://" in ln), None
            ),
            what="the agent to start",
            check=self,
        )
        self.metrics_url = line.split("metrics at ", 1)[1].strip()

    def text(self) -> str:
        return self.log.read_text()

    def signal(self, sig: int) -> None:
        self.proc.send_signal(sig)

    def stop(self) -> int:
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout=30)

    def metrics(self) -> dict[str, float]:
        values = {}
        for line in httpx.get(self.metrics_url, timeout=5).text.splitlines():
            if line and not line.startswith("#"):
                name, _, value = line.rpartition(" ")
                values[name] = float(value)
        return values

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)


def wait_for(predicate, what: str, timeout: float = 20.0, check: AgentProcess | None = None):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        if check is not None and check.proc.poll() is not None:
            pytest.fail(
                f"agent exited ({check.proc.returncode}) while waiting for {what}:\n" + check.text()
            )
        time.sleep(0.05)
    detail = ("\n" + check.text()) if check is not None else ""
    pytest.fail(f"timed out waiting for {what}{detail}")

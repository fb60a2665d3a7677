"""Fixtures for the cluster tests: real nats-server processes and hub processes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.cluster.harness import NATS_SERVER, NatsServer, start_cluster, wait_jetstream_ready


@pytest.fixture
def nats_server(tmp_path: Path) -> Iterator[NatsServer]:
    if NATS_SERVER is None:
        pytest.skip("nats-server is not installed (make system-deps)")
    server = NatsServer(tmp_path / "nats").start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def nats_cluster(tmp_path: Path) -> Iterator[list[NatsServer]]:
    if NATS_SERVER is None:
        pytest.skip("nats-server is not installed (make system-deps)")
    servers = start_cluster(tmp_path / "cluster")
    try:
        wait_jetstream_ready(servers[0].url)
        yield servers
    finally:
        for server in servers:
            server.stop()


# Replays of old events end; the hub's clock then moves on with the wall clock (HubClock),
# so held matches are handed on once the allowance has passed: short, for the tests.
QUICK_LATENESS_S = 3.0


class HubProcess:
    """`hpcsec hub` in a child process, alerts to a JSONL file (and to `output`, if given)."""

    def __init__(
        self,
        tmp: Path,
        urls: list[str],
        member: str = "0/1",
        name: str = "hub",
        log_name: str | None = None,
        lateness_s: float = QUICK_LATENESS_S,
        output: str | None = None,
        spool: Path | None = None,
        secret_file: Path | None = None,
    ):
        """`name` picks the output file; a restart keeps it (its spool is for that output)
        and takes a fresh `log_name`. `lateness_s`: the config's correlation_lateness_s.
        `output`: a second output URL (a webhook: `secret_file` signs it), spooled in
        `spool` (default: `tmp`/spool)."""
        self.tmp, self.urls, self.member, self.name = tmp, urls, member, name
        self.output, self.secret_file = output, secret_file
        self.spool = spool or tmp / "spool"
        self.config = tmp / f"{name}-config.yml"
        self.config.write_text(f"correlation_lateness_s: {lateness_s}\n")
        self.alerts_file = tmp / f"{name}-alerts.jsonl"
        self.log = tmp / f"{log_name or name}.log"
        self.proc: subprocess.Popen | None = None

    def start(self) -> HubProcess:
        self.launch()
        self.wait_log("partitions", 60)
        return self

    def launch(self) -> HubProcess:
        """The process started, not yet waited for (`wait_log("partitions", ...)`)."""
        args = [sys.executable, "-m", "hpcsec.detector.cli.main", "hub", "--member", self.member]
        for url in self.urls:
            args += ["--nats", url]
        args += ["--output", f"file://{self.alerts_file}", "--spool", str(self.spool)]
        if self.output:
            args += ["--output", self.output]
        if self.secret_file:
            args += ["--webhook-secret-file", str(self.secret_file)]
        args += ["--config", str(self.config)]
        log = open(self.log, "ab")  # noqa: SIM115 - the child keeps it
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        self.proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, env=env)
        log.close()
        return self

    def wait_log(self, text: str, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.log.exists() and text in self.log.read_text(errors="replace"):
                return
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise AssertionError(f"hub exited {self.proc.returncode}:\n{self.log.read_text()}")
            time.sleep(0.1)
        raise AssertionError(f"hub did not log {text!r}:\n{self.log.read_text()}")

    def alerts(self) -> list[dict]:
        if not self.alerts_file.exists():
            return []
        lines = self.alerts_file.read_text().splitlines()
        return [json.loads(line) for line in lines if line.strip()]

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def terminate(self) -> int:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(30)

    def cleanup(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.kill()


@pytest.fixture
def hubs(tmp_path: Path) -> Iterator[list[HubProcess]]:
    started: list[HubProcess] = []
    yield started
    for hub in started:
        hub.cleanup()


def wait_for(predicate: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")

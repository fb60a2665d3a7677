"""Real nats-server processes for the cluster tests and the benchmark.

Every server listens on free loopback ports and keeps its JetStream files in a directory
the caller owns; `stop` ends only the processes started here, by their pid.
"""

from __future__ import annotations

import contextlib
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

NATS_SERVER = shutil.which("nats-server") or (
    "/usr/sbin/nats-server" if Path("/usr/sbin/nats-server").exists() else None
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_port(port: int, proc: subprocess.Popen, timeout_s: float = 15.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"nats-server exited with {proc.returncode}")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.2):
            return
        time.sleep(0.05)
    raise RuntimeError(f"nats-server did not listen on {port}")


@dataclass
class NatsServer:
    root: Path
    name: str = "n1"
    jetstream: bool = True
    port: int = field(default_factory=free_port)
    cluster_port: int = field(default_factory=free_port)
    routes: list[int] = field(default_factory=list)  # cluster ports of the other servers
    extra_config: str = ""  # more of nats-server's config (an authorization block, say)
    proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    def url_for(self, user: str, password: str) -> str:
        return f"nats://{user}:{password}@127.0.0.1:{self.port}"

    def _config(self) -> str:
        store = self.root / self.name
        lines = [f'server_name: "{self.name}"', "listen: 127.0.0.1:" + str(self.port)]
        if self.jetstream:
            lines.append(f'jetstream {{ store_dir: "{store}" }}')
        if self.routes:
            routes = ", ".join(f"nats-route://127.0.0.1:{p}" for p in self.routes)
            lines.append(
                f'cluster {{ name: "hpcsec-test", listen: 127.0.0.1:{self.cluster_port}, '
                f"routes: [{routes}] }}"
            )
        if self.extra_config:
            lines.append(self.extra_config)
        return "\n".join(lines) + "\n"

    def start(self) -> NatsServer:
        assert NATS_SERVER, "nats-server is not installed"
        self.root.mkdir(parents=True, exist_ok=True)
        conf = self.root / f"{self.name}.conf"
        conf.write_text(self._config())
        log = open(self.root / f"{self.name}.log", "ab")  # noqa: SIM115 - the server keeps it
        self.proc = subprocess.Popen(
            [NATS_SERVER, "-c", str(conf)], stdout=log, stderr=subprocess.STDOUT
        )
        log.close()
        _wait_port(self.port, self.proc)
        return self

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.kill()


def start_cluster(root: Path, size: int = 3) -> list[NatsServer]:
    servers = [NatsServer(root, name=f"n{i + 1}") for i in range(size)]
    for server in servers:
        server.routes = [s.cluster_port for s in servers if s is not server]
    for server in servers:
        server.start()
    return servers


def wait_jetstream_ready(url: str, timeout_s: float = 30.0) -> None:
    """A fresh JetStream cluster elects its meta leader after a few seconds."""
    import asyncio

    import nats

    async def probe() -> bool:
        nc = await nats.connect(url, connect_timeout=2)
        try:
            await nc.jetstream().account_info()
            return True
        except Exception:
            return False
        finally:
            await nc.close()

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if asyncio.run(probe()):
            return
        time.sleep(0.3)
    raise RuntimeError("JetStream did not become ready")


def acked_events(url: str) -> int:
    """Events acknowledged over every partition's hub consumer (their ack floors)."""
    import asyncio

    from hpcsec.detector.cluster.consumer import durable_name
    from hpcsec.detector.cluster.partition import PARTITIONS
    from hpcsec.detector.cluster.streams import EVENTS_STREAM, connect

    async def floors() -> int:
        nc = await connect([url], reconnect=False)
        try:
            js, total = nc.jetstream(), 0
            for partition in range(PARTITIONS):
                info = await js.consumer_info(EVENTS_STREAM, durable_name(partition))
                total += info.ack_floor.stream_seq if info.ack_floor else 0
            return total
        finally:
            await nc.close()

    return asyncio.run(floors())

"""The agent's self-metrics (Prometheus), on its own registry and a loopback address.

Its own registry, so the scrape shows only what the agent measures (no default process
collectors from another library that happens to be imported), and a loopback address by
default: the metrics name sensors and rules, which is nobody else's business.

Any local user can connect to the endpoint, so it is served by one thread and one selector
loop: no connection, idle or slow, makes the agent start a thread. At most MAX_CONNECTIONS
are open (a new one closes the oldest), each has CONNECTION_TIMEOUT_S to send its request
and take the answer, and a request is at most MAX_REQUEST_BYTES.
"""

from __future__ import annotations

import selectors
import socket
import threading
import time
from dataclasses import dataclass, field

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)

from hpcsec.detector.core.errors import UsageError


def parse_address(address: str) -> tuple[str, int]:
    """`HOST:PORT` (IPv6 as `[::1]:PORT`) -> (host, port); port 0 picks a free one."""
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit() or int(port) > 65535:
        raise UsageError(f"metrics address {address!r}: expected HOST:PORT, e.g. 127.0.0.1:9817")
    return (host.strip("[]") or "127.0.0.1"), int(port)


MAX_CONNECTIONS = 32
CONNECTION_TIMEOUT_S = 5.0
MAX_REQUEST_BYTES = 8192
SENSOR_STATES = ("ok", "unavailable", "error")  # hpcsec_sensor_state{state}


@dataclass
class _Connection:
    sock: socket.socket
    deadline: float
    request: bytes = b""
    answer: bytes = b""
    opened: float = field(default_factory=time.monotonic)


class MetricsServer:
    """/metrics over HTTP/1.0 in one thread: a selector over the listening socket and at most
    MAX_CONNECTIONS client sockets, each closed at its deadline."""

    def __init__(self, registry: CollectorRegistry, listener: socket.socket):
        self.registry = registry
        self.listener = listener
        self.server_address = listener.getsockname()
        self._selector = selectors.DefaultSelector()
        self._selector.register(listener, selectors.EVENT_READ, None)
        self._clients: dict[int, _Connection] = {}  # by fd, oldest first
        self.refused = 0  # connections closed to make room for a newer one

    def serve_forever(self) -> None:
        while True:
            self.serve_once(timeout=1.0)

    def serve_once(self, timeout: float) -> None:
        for key, mask in self._selector.select(timeout):
            if key.data is None:
                self._accept()
            elif mask & selectors.EVENT_READ:
                self._read(key.data)
            else:
                self._write(key.data)
        now = time.monotonic()
        for conn in [c for c in self._clients.values() if c.deadline <= now]:
            self._close(conn)

    def _accept(self) -> None:
        try:
            sock, _ = self.listener.accept()
        except OSError:
            return
        if len(self._clients) >= MAX_CONNECTIONS:  # the oldest waits longest: it goes
            self.refused += 1
            self._close(next(iter(self._clients.values())))
        sock.setblocking(False)
        conn = _Connection(sock, time.monotonic() + CONNECTION_TIMEOUT_S)
        self._clients[sock.fileno()] = conn
        self._selector.register(sock, selectors.EVENT_READ, conn)

    def _read(self, conn: _Connection) -> None:
        try:
            data = conn.sock.recv(4096)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        conn.request += data
        if not data or len(conn.request) > MAX_REQUEST_BYTES:
            self._close(conn)
        elif b"\r\n\r\n" in conn.request or b"\n\n" in conn.request:
            conn.answer = self._answer(conn.request)
            self._selector.modify(conn.sock, selectors.EVENT_WRITE, conn)

    def _answer(self, request: bytes) -> bytes:
        method, _, rest = request.partition(b" ")
        path = rest.split(b" ", 1)[0].split(b"?", 1)[0]
        if method not in (b"GET", b"HEAD") or path not in (b"/", b"/metrics"):
            status, ctype, body = b"404 Not Found", b"text/plain", b"not found\n"
        else:
            status, ctype = b"200 OK", CONTENT_TYPE_LATEST.encode()
            body = generate_latest(self.registry) if method == b"GET" else b""
        head = b"HTTP/1.0 %s\r\nContent-Type: %s\r\nContent-Length: %d\r\n" % (
            status,
            ctype,
            len(body),
        )
        return head + b"Connection: close\r\n\r\n" + body

    def _write(self, conn: _Connection) -> None:
        try:
            sent = conn.sock.send(conn.answer)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            sent = len(conn.answer)
        conn.answer = conn.answer[sent:]
        if not conn.answer:
            self._close(conn)

    def _close(self, conn: _Connection) -> None:
        if self._clients.pop(conn.sock.fileno(), None) is None:
            return
        self._selector.unregister(conn.sock)
        conn.sock.close()


def _listen(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(128)
        sock.setblocking(False)
    except BaseException:
        sock.close()
        raise
    return sock


class AgentMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.events = Counter(
            "hpcsec_events_total", "Events produced, by sensor", ["sensor"], registry=r
        )
        self.drops = Counter(
            "hpcsec_events_dropped_total",
            "Events dropped because the agent queue was full, by sensor",
            ["sensor"],
            registry=r,
        )
        self.alerts = Counter(
            "hpcsec_alerts_total",
            "Alerts raised, by vector, level and disposition (sent, silenced, rate_limited)",
            ["vector", "level", "disposition"],
            registry=r,
        )
        self.eval_seconds = Histogram(
            "hpcsec_rule_evaluation_seconds",
            "Time to evaluate one micro-batch",
            buckets=(0.0005, 0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0),
            registry=r,
        )
        self.batch_events = Histogram(
            "hpcsec_batch_events",
            "Events in one micro-batch",
            buckets=(1, 10, 100, 1000, 4096, 16384),
            registry=r,
        )
        self.sample_seconds = Histogram(
            "hpcsec_sample_seconds",
            "Time of one sampling cycle of all sampled sensors",
            buckets=(0.005, 0.01, 0.02, 0.05, 0.1, 0.5, 1.0, 5.0),
            registry=r,
        )
        self._declare_delivery(r)
        self._declare_state(r)

    def _declare_delivery(self, r: CollectorRegistry) -> None:
        self.spool_depth = Gauge(
            "hpcsec_spool_depth", "Alerts waiting in the spool", ["destination"], registry=r
        )
        self.delivered = Counter(
            "hpcsec_alerts_delivered_total",
            "Alerts a destination accepted",
            ["destination"],
            registry=r,
        )
        self.delivery_failed = Counter(
            "hpcsec_alerts_refused_total",
            "Alerts a destination refused for good, or the full spool dropped",
            ["destination"],
            registry=r,
        )
        self.unspooled = Counter(
            "hpcsec_alerts_unspooled_total",
            "Alerts the spool could not take (disk full), held in memory and sent directly",
            ["destination"],
            registry=r,
        )
        self.spool_corrupt = Counter(
            "hpcsec_spool_corrupt_total",
            "Unreadable spool lines moved to the spool's failed/ folder",
            ["destination"],
            registry=r,
        )
        self.store_errors = Counter(
            "hpcsec_store_errors_total", "Alert store writes that failed", registry=r
        )
        self.store_events_dropped = Counter(
            "hpcsec_store_events_dropped_total",
            "Events let go unstored while the store could not be written (oldest first)",
            registry=r,
        )

    def _declare_state(self, r: CollectorRegistry) -> None:
        self.last_sample = Gauge(
            "hpcsec_last_sample_timestamp_seconds",
            "Unix time of the last completed sample",
            registry=r,
        )
        self.last_sample_age = Gauge(
            "hpcsec_last_sample_age_seconds", "Seconds since the last completed sample", registry=r
        )
        self._last_sample_at: float | None = None
        self.last_sample_age.set_function(self._sample_age)
        self.sensor_up = Gauge(
            "hpcsec_sensor_up", "1 when the sensor ran in its last run", ["sensor"], registry=r
        )
        # `sensor_up` 0 mixes "no such source on this node" with "broken": the state gauge
        # tells them apart (the Prometheus enum idiom: 1 on the current state, 0 on the others)
        self.sensor_state = Gauge(
            "hpcsec_sensor_state",
            "1 on the state of the sensor's last run: ok, unavailable (not applicable on this "
            "node) or error (failing)",
            ["sensor", "state"],
            registry=r,
        )
        self.reloads = Counter(
            "hpcsec_reloads_total", "Rule/config reloads, by outcome", ["outcome"], registry=r
        )
        self.queue_depth = Gauge("hpcsec_queue_depth", "Events waiting for evaluation", registry=r)
        self.rules_loaded = Gauge(
            "hpcsec_rules_loaded", "Rules in the running rule set", registry=r
        )

    def sensor_ran(self, sensor: str, status: str) -> None:
        """Record a sensor run's status (`ok`, `unavailable`, `error`) on both gauges; an
        unknown status counts as `error`: something is wrong, whatever it is."""
        state = status if status in SENSOR_STATES else "error"
        self.sensor_up.labels(sensor).set(1 if state == "ok" else 0)
        for name in SENSOR_STATES:
            self.sensor_state.labels(sensor, name).set(1 if name == state else 0)

    def sampled(self, seconds: float) -> None:
        now = time.time()
        self._last_sample_at = now
        self.last_sample.set(now)
        self.sample_seconds.observe(seconds)

    def _sample_age(self) -> float:
        return -1.0 if self._last_sample_at is None else time.time() - self._last_sample_at

    def serve(self, address: str) -> tuple[MetricsServer, str]:
        """Serve /metrics in one thread; returns the server and the address it listens on
        (the real port)."""
        host, port = parse_address(address)
        try:
            server = MetricsServer(self.registry, _listen(host, port))
        except OSError as exc:
            raise UsageError(f"cannot serve metrics on {address}: {exc.strerror}") from None
        threading.Thread(target=server.serve_forever, name="hpcsec-metrics", daemon=True).start()
        bound_host, bound_port = server.server_address[:2]
        shown = f"[{bound_host}]" if ":" in str(bound_host) else str(bound_host)
        return server, f"{shown}:{bound_port}"

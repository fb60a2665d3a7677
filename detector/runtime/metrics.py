"""The agent's self-metrics (Prometheus), on its own registry and a loopback address.

Its own registry, so the scrape shows only what the agent measures (no default process
collectors from another library that happens to be imported), and a loopback address by
default: the metrics name sensors and rules, which is nobody else's business.
"""

from __future__ import annotations

import socket
import threading
import time
from socketserver import ThreadingMixIn
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, make_wsgi_app

from hpcsec.detector.core.errors import UsageError


def parse_address(address: str) -> tuple[str, int]:
    """`HOST:PORT` (IPv6 as `[::1]:PORT`) -> (host, port); port 0 picks a free one."""
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit() or int(port) > 65535:
        raise UsageError(f"metrics address {address!r}: expected HOST:PORT, e.g. 127.0.0.1:9817")
    return (host.strip("[]") or "127.0.0.1"), int(port)


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass  # a scrape every 15 s is not news for the journal


def _server_class(host: str) -> type[WSGIServer]:
    class Server(ThreadingMixIn, WSGIServer):
        daemon_threads = True
        address_family = socket.AF_INET6 if ":" in host else socket.AF_INET

    return Server


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
        self.reloads = Counter(
            "hpcsec_reloads_total", "Rule/config reloads, by outcome", ["outcome"], registry=r
        )
        self.queue_depth = Gauge("hpcsec_queue_depth", "Events waiting for evaluation", registry=r)
        self.rules_loaded = Gauge(
            "hpcsec_rules_loaded", "Rules in the running rule set", registry=r
        )

    def sampled(self, seconds: float) -> None:
        now = time.time()
        self._last_sample_at = now
        self.last_sample.set(now)
        self.sample_seconds.observe(seconds)

    def _sample_age(self) -> float:
        return -1.0 if self._last_sample_at is None else time.time() - self._last_sample_at

    def serve(self, address: str) -> tuple[object, str]:
        """Serve /metrics; returns the server and the address it listens on (real port).

        prometheus_client's own server thread wakes twice a second to look for a shutdown
        request; this one sleeps until a scrape arrives (the agent never shuts it down: it
        ends with the process).
        """
        host, port = parse_address(address)
        try:
            server = make_server(
                host,
                port,
                make_wsgi_app(self.registry),
                _server_class(host),
                handler_class=_QuietHandler,
            )
        except OSError as exc:
            raise UsageError(f"cannot serve metrics on {address}: {exc.strerror}") from None
        threading.Thread(
            target=server.serve_forever,
            kwargs={"poll_interval": 3600.0},
            name="hpcsec-metrics",
            daemon=True,
        ).start()
        bound_host, bound_port = server.server_address[:2]
        host = bound_host.decode() if isinstance(bound_host, bytes) else str(bound_host)
        shown = f"[{host}]" if ":" in host else host
        return server, f"{shown}:{bound_port}"

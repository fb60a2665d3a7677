"""What every output is and what it may raise; nothing here knows an implementation.

One way to name an output (a contract, the same in the config file and on the command line):
`syslog+udp|tcp|tls://HOST:PORT`, `http(s)://…` (webhook), `splunk+https://HOST:PORT` (Splunk
HEC), `elasticsearch+https://HOST:PORT/INDEX` (bulk API), `file:///PATH.jsonl`, `-`.
registry.py turns such a URL into an Output; delivery.py sends alerts through a set of them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from hpcsec.detector.core.display import redacted_url
from hpcsec.detector.core.errors import HpcsecError

# Outputs only read alerts: an alert is a value that other outputs, the store and the
# suppression state share, so no output may change it.
Alert = Mapping[str, Any]


class OutputError(HpcsecError):
    """An output URL or its settings are invalid (unknown type, bad URL, unreadable secret)."""


class DeliveryFailed(Exception):
    """One attempt did not get the alert to the receiver.

    `permanent`: the receiver refused this alert and will refuse it again (HTTP 400, 413, …);
    it is moved aside instead of being retried forever. `retry_after`: seconds the receiver
    asked us to wait (HTTP 429/503 Retry-After).
    """

    def __init__(self, message: str, *, permanent: bool = False, retry_after: float | None = None):
        super().__init__(message)
        self.permanent = permanent
        self.retry_after = retry_after


class Output(Protocol):
    """A destination. `send` delivers one alert or raises DeliveryFailed; it never retries
    itself: retries, backoff and Retry-After are the delivery loop's job (one policy for all)."""

    name: str  # the URL without credentials or query: what reports and the store show
    durable: bool  # True: goes through the spool (network outputs)

    def send(self, alert: Alert) -> None: ...

    def close(self) -> None: ...


@dataclass(frozen=True)
class OutputOptions:
    """What an output needs besides its URL."""

    secret_file: str | None = None
    secret_must_be_private: bool = False  # True: a secret file others can read is an error
    syslog_format: str = "json"
    timeout_s: float = 10.0
    # per output (a config entry with `url:`): extra HTTP headers, a value or `{file: PATH}`;
    # the Splunk HEC token / Elasticsearch API key file; whether a webhook signs (None: when
    # a secret file is given, or required when the webhook has no other credential)
    headers: Mapping[str, str | Mapping[str, str]] = field(default_factory=dict)
    token_file: str | None = None
    sign: bool | None = None


def redact(url: str) -> str:
    """The URL as scheme, host, port and a short hash (core.display.redacted_url): what an
    output is called in reports, logs, metrics labels, alerts and spool directory names.

    Here rather than in the registry: outputs name themselves with it, and an output must not
    import the registry that opens it."""
    return redacted_url(url)

"""`http(s)://…`: signed JSON POST of one alert per request.

Headers a receiver relies on (docs/outputs.md shows how to verify them):
- `X-Hpcsec-Timestamp`: Unix seconds when this attempt was signed; refuse old ones (replays).
- `X-Hpcsec-Signature`: `sha256=` + hex HMAC-SHA256, keyed with the shared secret, over
  `<timestamp>.<body>` (the exact body bytes).
- `Idempotency-Key`: the alert's `alert.id`; delivery is at least once, so deduplicate on it.

One attempt per `send`. Retrying (exponential backoff with jitter, Retry-After on 429/503) is
the delivery loop's, in delivery.py, so the spool keeps the alert between attempts.
"""

from __future__ import annotations

import hashlib
import hmac
import time
from collections.abc import Mapping
from datetime import UTC
from email.utils import parsedate_to_datetime

import httpx

from hpcsec.detector.core.display import visible_json
from hpcsec.detector.core.log import get_logger
from hpcsec.detector.outputs.alertjson import alert_bytes
from hpcsec.detector.outputs.fit import fit
from hpcsec.detector.outputs.httpauth import (
    check_http_url,
    http_client,
    read_private_file,
    resolve_headers,
    transport_failure,
)
from hpcsec.detector.outputs.protocol import (
    Alert,
    DeliveryFailed,
    OutputError,
    OutputOptions,
    redact,
)

# Refusals that are about this one alert: sending it again cannot help. Every other 4xx
# (401 wrong secret, 404 wrong path, 403, 405, …) is a receiver or config problem that an
# operator fixes, so those alerts stay spooled and are retried.
PERMANENT_STATUSES = frozenset({400, 413, 415, 422})
# The largest request body: an alert that would be bigger is cut to fit (fit.py). Receivers
# commonly accept 1 MiB or more; a 64 KiB command line with control characters stays below.
MAX_BODY_BYTES = 1 << 20
USER_AGENT = "hpcsec-webhook/1"
logger = get_logger(__name__)


def read_secret(path: str | None, url: str, must_be_private: bool = False) -> bytes:
    """The signing secret in `path`. A file that group or others may read is a leaked secret:
    a warning, or with `must_be_private` (the agent, a long-running service) an error."""
    if not path:
        raise OutputError(
            f"webhook output {redact(url)} needs a signing secret: "
            "--webhook-secret-file FILE (or webhook_secret_file in the config), or "
            "`sign: false` with its own credential in `headers:` (docs/integrations.md)"
        )
    return read_private_file(path, "webhook secret", must_be_private)


def signing_secret(url: str, options: OutputOptions) -> bytes | None:
    """The HMAC key, or None for a webhook that does not sign (`sign: false`, or no secret
    given and a credential header of its own, as a Logic App or DCR endpoint wants)."""
    if options.sign is False:
        return None
    if options.sign is None and not options.secret_file and options.headers:
        return None
    return read_secret(options.secret_file, url, options.secret_must_be_private)


def _json_body(alert: Alert) -> bytes:
    return visible_json(alert_bytes(alert))  # DEL and C1 controls as \\u escapes too


def sign(secret: bytes, timestamp: str, body: bytes) -> str:
    mac = hmac.new(secret, timestamp.encode() + b"." + body, hashlib.sha256)
    return "sha256=" + mac.hexdigest()


def parse_retry_after(value: str | None, now: float | None = None) -> float | None:
    """Seconds to wait from a Retry-After header (delta-seconds or an HTTP date)."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    now = time.time() if now is None else now
    return max(0.0, when.timestamp() - now)


def raise_for_status(response: httpx.Response, permanent: frozenset[int]) -> None:
    """Nothing for a 2xx; else DeliveryFailed, permanent for `permanent` statuses, with the
    receiver's Retry-After for 429 and 503."""
    status = response.status_code
    if 200 <= status < 300:
        return
    reason = f"HTTP {status} {response.reason_phrase}".strip()
    if status in permanent:
        raise DeliveryFailed(reason, permanent=True)
    retry_after = None
    if status in (429, 503):
        retry_after = parse_retry_after(response.headers.get("Retry-After"))
    raise DeliveryFailed(reason, retry_after=retry_after)


class WebhookOutput:
    durable = True

    def __init__(
        self,
        url: str,
        secret: bytes | None,
        timeout_s: float = 10.0,
        headers: Mapping[str, str] | None = None,
    ):
        self.url = url
        self.name = redact(url)
        self._secret = secret
        self._headers = dict(headers or {})
        self._client = http_client(timeout_s, USER_AGENT)

    @classmethod
    def from_url(cls, url: str, options: OutputOptions) -> WebhookOutput:
        check_http_url(url, "webhook", "http(s)://HOST[:PORT]/PATH")
        secret = signing_secret(url, options)
        where = f"webhook output {redact(url)}"
        headers = resolve_headers(options.headers, where, options.secret_must_be_private)
        return cls(url, secret, options.timeout_s, headers)

    def request_headers(self, alert: Alert, body: bytes) -> dict[str, str]:
        headers = {
            **self._headers,
            "Content-Type": "application/json",
            "Idempotency-Key": str(alert.get("alert.id", "")),
        }
        if self._secret is not None:
            timestamp = str(int(time.time()))
            headers["X-Hpcsec-Timestamp"] = timestamp
            headers["X-Hpcsec-Signature"] = sign(self._secret, timestamp, body)
        return headers

    def send(self, alert: Alert) -> None:
        body = fit(alert, _json_body, MAX_BODY_BYTES)
        try:
            response = self._client.post(
                self.url, content=body, headers=self.request_headers(alert, body)
            )
        except httpx.TransportError as exc:
            raise transport_failure(exc, self.url, self.name) from None
        raise_for_status(response, PERMANENT_STATUSES)

    def close(self) -> None:
        self._client.close()

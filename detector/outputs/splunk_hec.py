"""`splunk+https://HOST:PORT[/services/collector/event]`: Splunk HTTP Event Collector (HEC).

One alert per request, as HEC's JSON envelope: `{"time", "host", "source": "hpcsec",
"sourcetype": "hpcsec:alert", "event": {alert}}`, with `Authorization: Splunk <token>` (the token
from `token_file` in the output's config entry, or `?token_file=PATH` on the URL) and an
`X-Splunk-Request-Channel` (this output's channel, a fixed UUID per URL).

HEC answers `{"text": "Success", "code": 0}`; with indexer acknowledgement on, also an `ackId`,
and the alert counts as delivered only once `/services/collector/ack` says it was indexed
(until then it stays in the spool and is sent again: receivers deduplicate on `alert.id`).
Refusals: 400 (bad data), 401/403 (token missing, invalid or disabled) and 413 are permanent;
503 (server busy) and 429 are retried with their Retry-After, anything else retried.
"""

from __future__ import annotations

import time
import uuid
from urllib.parse import parse_qs, urlsplit, urlunsplit

import httpx
import orjson

from hpcsec.detector.core.display import visible_json
from hpcsec.detector.core.timefmt import parse_time
from hpcsec.detector.outputs.alertjson import alert_bytes
from hpcsec.detector.outputs.fit import fit
from hpcsec.detector.outputs.httpauth import (
    check_http_url,
    http_client,
    read_private_file,
    transport_failure,
)
from hpcsec.detector.outputs.protocol import (
    Alert,
    DeliveryFailed,
    OutputError,
    OutputOptions,
    redact,
)
from hpcsec.detector.outputs.webhook import raise_for_status

EVENT_PATH = "/services/collector/event"
ACK_PATH = "/services/collector/ack"
PERMANENT_STATUSES = frozenset({400, 401, 403, 413})
MAX_BODY_BYTES = 1 << 20  # HEC's default max_content_length is 800 MB; 1 MiB like the webhook
ACK_POLL_S = 0.2
USER_AGENT = "hpcsec-splunk-hec/1"


def _envelope(alert: Alert) -> bytes:
    try:
        when = parse_time(str(alert.get("@timestamp", ""))).timestamp()
    except ValueError:
        when = time.time()
    event = orjson.Fragment(alert_bytes(alert))
    envelope = {
        "time": round(when, 3),
        "host": str(alert.get("host.name", "")),
        "source": "hpcsec",
        "sourcetype": "hpcsec:alert",
        "event": event,
    }
    return visible_json(orjson.dumps(envelope))


class SplunkHecOutput:
    durable = True

    def __init__(self, url: str, token: bytes, timeout_s: float = 10.0):
        parts = urlsplit(url.removeprefix("splunk+"))
        path = parts.path.rstrip("/") or EVENT_PATH
        self.name = redact(url)
        self.url = urlunsplit((parts.scheme, parts.netloc, path, "", ""))
        self.ack_url = urlunsplit((parts.scheme, parts.netloc, ACK_PATH, "", ""))
        # one channel per destination: the name is the URL's hash, so it survives restarts
        self.channel = str(uuid.uuid5(uuid.NAMESPACE_URL, self.name))
        self._timeout_s = timeout_s
        self._client = http_client(timeout_s, USER_AGENT)
        self._client.headers.update({"Authorization": f"Splunk {token.decode('utf-8', 'replace')}"})
        self._client.headers["X-Splunk-Request-Channel"] = self.channel

    @classmethod
    def from_url(cls, url: str, options: OutputOptions) -> SplunkHecOutput:
        check_http_url(url, "splunk", "splunk+https://HOST:PORT[/services/collector/event]")
        query = parse_qs(urlsplit(url).query)
        token_file = options.token_file or next(iter(query.get("token_file", [])), None)
        if not token_file:
            raise OutputError(
                f"splunk output {redact(url)} needs a HEC token: token_file in its config "
                "entry, or ?token_file=PATH on the URL"
            )
        token = read_private_file(token_file, "Splunk HEC token", options.secret_must_be_private)
        if any(c in token for c in b"\r\n\0 "):
            raise OutputError(f"Splunk HEC token file {token_file} holds more than one token")
        return cls(url, token, options.timeout_s)

    def send(self, alert: Alert) -> None:
        body = fit(alert, _envelope, MAX_BODY_BYTES)
        response = self._post(self.url, body)
        raise_for_status(response, PERMANENT_STATUSES)
        ack_id = _json(response).get("ackId")
        if isinstance(ack_id, int):
            self._wait_for_ack(ack_id)

    def _post(self, url: str, body: bytes) -> httpx.Response:
        try:
            return self._client.post(
                url, content=body, headers={"Content-Type": "application/json"}
            )
        except httpx.TransportError as exc:
            raise transport_failure(exc, url, self.name) from None

    def _wait_for_ack(self, ack_id: int) -> None:
        """Delivered once indexed; not acknowledged in time: sent again later (at least once)."""
        deadline = time.monotonic() + self._timeout_s
        query = orjson.dumps({"acks": [ack_id]})
        while True:
            response = self._post(self.ack_url, query)
            raise_for_status(response, frozenset({400, 401, 403}))
            acks = _json(response).get("acks")
            if isinstance(acks, dict) and acks.get(str(ack_id)) is True:
                return
            if time.monotonic() >= deadline:
                raise DeliveryFailed(f"HEC did not acknowledge ackId {ack_id} in time")
            time.sleep(ACK_POLL_S)

    def close(self) -> None:
        self._client.close()


def _json(response: httpx.Response) -> dict:
    try:
        value = response.json()
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}

"""`elasticsearch+https://HOST:PORT/INDEX`: Elasticsearch or OpenSearch `_bulk` API, ECS documents.

One alert per request: `POST /INDEX/_bulk` with NDJSON `{"create": {"_id": alert.id}}` and the
document (ecs.py). `create` with the alert's id makes delivery idempotent: an alert sent again
(at least once, from the spool) is answered 409 for that item and counts as delivered; `create`
is also what data streams accept. The API key comes from `token_file` in the output's config
entry or `?token_file=PATH` on the URL (`Authorization: ApiKey <key>`, the base64 `encoded`
form Elasticsearch returns).

Bulk answers 200 even when items fail (`errors: true`): each item's status decides, 201/200
delivered, 409 already there (delivered), 429 retried, other 4xx refused for good (mapping
conflict, bad document), 5xx retried. The whole request refused: 429 and 503 retried with their
Retry-After, 400/413 permanent, anything else (401/403: a key an operator fixes) retried.
"""

from __future__ import annotations

from urllib.parse import parse_qs, quote, urlsplit, urlunsplit

import httpx
import orjson

from hpcsec.detector.core.display import visible_json
from hpcsec.detector.outputs.alertjson import json_default
from hpcsec.detector.outputs.ecs import ecs_document
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

PERMANENT_STATUSES = frozenset({400, 413})
MAX_BODY_BYTES = 1 << 20
USER_AGENT = "hpcsec-elasticsearch/1"


def _document(alert: Alert) -> bytes:
    return visible_json(orjson.dumps(ecs_document(alert), default=json_default))


class ElasticsearchOutput:
    durable = True

    def __init__(self, url: str, api_key: bytes | None, timeout_s: float = 10.0):
        parts = urlsplit(url.removeprefix("elasticsearch+"))
        self.index = parts.path.strip("/")
        self.name = redact(url)
        self.url = urlunsplit(
            (parts.scheme, parts.netloc, f"/{quote(self.index, safe='')}/_bulk", "", "")
        )
        self._client = http_client(timeout_s, USER_AGENT)
        if api_key is not None:
            key = api_key.decode("utf-8", "replace")
            self._client.headers["Authorization"] = f"ApiKey {key}"

    @classmethod
    def from_url(cls, url: str, options: OutputOptions) -> ElasticsearchOutput:
        expected = "elasticsearch+https://HOST:PORT/INDEX"
        check_http_url(url, "elasticsearch", expected)
        index = urlsplit(url).path.strip("/")
        if not index or "/" in index or index.startswith(("_", "-", "+")):
            raise OutputError(f"elasticsearch output {redact(url)!r}: expected {expected}")
        query = parse_qs(urlsplit(url).query)
        key_file = options.token_file or next(iter(query.get("token_file", [])), None)
        key = None
        if key_file:
            key = read_private_file(
                key_file, "Elasticsearch API key", options.secret_must_be_private
            )
            if any(c in key for c in b"\r\n\0 "):
                raise OutputError(f"Elasticsearch API key file {key_file} holds more than a key")
        return cls(url, key, options.timeout_s)

    def send(self, alert: Alert) -> None:
        action = orjson.dumps({"create": {"_id": str(alert.get("alert.id", ""))}})
        body = action + b"\n" + fit(alert, _document, MAX_BODY_BYTES) + b"\n"
        try:
            response = self._client.post(
                self.url, content=body, headers={"Content-Type": "application/x-ndjson"}
            )
        except httpx.TransportError as exc:
            raise transport_failure(exc, self.url, self.name) from None
        raise_for_status(response, PERMANENT_STATUSES)
        _check_item(response)

    def close(self) -> None:
        self._client.close()


def _check_item(response: httpx.Response) -> None:
    """The one item's outcome in a 200 bulk answer."""
    try:
        answer = response.json()
        item = answer["items"][0]["create"]
        status = int(item["status"])
    except (ValueError, KeyError, IndexError, TypeError):
        raise DeliveryFailed("bulk answer without the item's status") from None
    if status < 300 or status == 409:  # 409: a document with this alert.id is already there
        return
    error = item.get("error") or {}
    kind = error.get("type", "") if isinstance(error, dict) else str(error)
    reason = f"bulk item HTTP {status} {kind}".strip()
    if status == 429 or status >= 500:
        raise DeliveryFailed(reason)
    raise DeliveryFailed(reason, permanent=True)

"""Local receivers that implement the request and response contracts of Splunk HEC and the
Elasticsearch `_bulk` API (as documented by Splunk and Elastic), for the SIEM output tests."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class HttpReceiver:
    """A threaded HTTP server on 127.0.0.1; `handle(path, headers, body)` -> (status, headers,
    JSON answer), called under the lock."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.requests: list[tuple[str, dict, bytes, float]] = []
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                with receiver.lock:
                    headers = dict(self.headers.items())
                    receiver.requests.append((self.path, headers, body, time.monotonic()))
                    status, extra, answer = receiver.handle(self.path, headers, body)
                data = json.dumps(answer).encode()
                self.send_response(status)
                for name, value in extra.items():
                    self.send_header(name, value)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def handle(self, path: str, headers: dict, body: bytes) -> tuple[int, dict, Any]:
        raise NotImplementedError

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class HecReceiver(HttpReceiver):
    """Splunk HEC: `/services/collector/event` with `Authorization: Splunk <token>`, the JSON
    envelope, `{"text":"Success","code":0}`; with `acks`, an `ackId` per channel and
    `/services/collector/ack`, which says false `pending_polls` times before true."""

    def __init__(self, token: str, acks: bool = False, pending_polls: int = 0):
        self.token, self.acks, self.pending_polls = token, acks, pending_polls
        self.events: list[dict] = []
        self.busy = 0  # answer 503 "Server is busy" to this many requests
        self.next_ack: dict[str, int] = {}
        self.ack_polls = 0
        super().__init__()

    def handle(self, path: str, headers: dict, body: bytes) -> tuple[int, dict, Any]:
        auth = headers.get("Authorization", "")
        if not auth:
            return 401, {}, {"text": "Token is required", "code": 2}
        if auth != f"Splunk {self.token}":
            return 403, {}, {"text": "Invalid token", "code": 4}
        channel = headers.get("X-Splunk-Request-Channel")
        if self.acks and not channel:
            return 400, {}, {"text": "Data channel is missing", "code": 10}
        if path == "/services/collector/ack":
            self.ack_polls += 1
            done = self.ack_polls > self.pending_polls
            return 200, {}, {"acks": {str(a): done for a in json.loads(body)["acks"]}}
        if path != "/services/collector/event":
            return 404, {}, {"text": "The requested URL was not found on this server.", "code": 404}
        if self.busy:
            self.busy -= 1
            return 503, {"Retry-After": "1"}, {"text": "Server is busy", "code": 9}
        try:
            envelope = json.loads(body)
        except ValueError:
            return 400, {}, {"text": "Invalid data format", "code": 6}
        if not isinstance(envelope, dict) or "event" not in envelope:
            return 400, {}, {"text": "Event field is required", "code": 12}
        self.events.append(envelope)
        answer: dict[str, Any] = {"text": "Success", "code": 0}
        if self.acks:
            assert channel is not None
            answer["ackId"] = self.next_ack.get(channel, 0)
            self.next_ack[channel] = answer["ackId"] + 1
        return 200, {}, answer


class BulkReceiver(HttpReceiver):
    """Elasticsearch `_bulk`: NDJSON action/document pairs, `create` with `_id` refused with
    409 when the id is taken, per-item errors under `errors: true`; `item_statuses` and
    `request_statuses` are canned answers for the next items / whole requests."""

    def __init__(self, api_key: str):
        self.api_key = api_key
        self.docs: dict[str, dict[str, dict]] = {}  # index -> _id -> document
        self.item_statuses: list[int] = []
        self.request_statuses: list[tuple[int, dict]] = []
        super().__init__()

    def handle(self, path: str, headers: dict, body: bytes) -> tuple[int, dict, Any]:
        if headers.get("Authorization") != f"ApiKey {self.api_key}":
            return 401, {}, {"error": {"type": "security_exception"}, "status": 401}
        if self.request_statuses:
            status, extra = self.request_statuses.pop(0)
            return status, extra, {"error": {"type": "es_rejected_execution_exception"}}
        index, _, endpoint = path.strip("/").partition("/")
        if endpoint != "_bulk" or headers.get("Content-Type") != "application/x-ndjson":
            return 400, {}, {"error": {"type": "illegal_argument_exception"}, "status": 400}
        lines = body.decode().splitlines()
        if not body.endswith(b"\n") or len(lines) % 2:
            return 400, {}, {"error": {"type": "illegal_argument_exception"}, "status": 400}
        items = []
        for action_line, doc_line in zip(lines[::2], lines[1::2], strict=True):
            ((op, meta),) = json.loads(action_line).items()
            assert op == "create"
            items.append({"create": self._create(index, meta["_id"], json.loads(doc_line))})
        errors = any(i["create"]["status"] >= 300 for i in items)
        return 200, {}, {"took": 1, "errors": errors, "items": items}

    def _create(self, index: str, doc_id: str, doc: dict) -> dict:
        status = self.item_statuses.pop(0) if self.item_statuses else 201
        if status == 201 and doc_id in self.docs.setdefault(index, {}):
            status = 409
        item: dict[str, Any] = {"_index": index, "_id": doc_id, "status": status}
        if status == 201:
            self.docs[index][doc_id] = doc
            item["result"] = "created"
        else:
            kinds = {
                409: "version_conflict_engine_exception",
                429: "es_rejected_execution_exception",
            }
            item["error"] = {"type": kinds.get(status, "mapper_parsing_exception")}
        return item

"""`file:///PATH.jsonl`: alerts appended to a local file, one JSON object per line.

Each alert is one `write` on an O_APPEND descriptor followed by fsync, so a reader tailing the
file (a log shipper) never sees half a line, and two writers do not interleave inside a line.
"""

from __future__ import annotations

import os
from typing import Any
from urllib.parse import unquote, urlsplit

from .base import DeliveryFailed, OutputError
from .encode import dumps


class JsonlOutput:
    durable = False

    def __init__(self, path: str):
        self.path = path
        self.name = f"file://{path}"
        try:
            self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o640)
        except OSError as exc:
            raise OutputError(f"output {self.name}: cannot open for appending: "
                              f"{exc.strerror}") from None

    @classmethod
    def from_url(cls, url: str) -> JsonlOutput:
        parts = urlsplit(url)
        if parts.netloc not in ("", "localhost") or not parts.path.startswith("/"):
            raise OutputError(f"output {url!r}: a file output is file:///ABSOLUTE/PATH.jsonl")
        if parts.query or parts.fragment:
            raise OutputError(f"output {url!r}: a file output takes no query or fragment")
        path = unquote(parts.path)
        if not path.endswith((".jsonl", ".ndjson")):
            raise OutputError(f"output {url!r}: a file output must end in .jsonl (one JSON "
                              "alert per line)")
        return cls(path)

    def send(self, alert: dict[str, Any]) -> None:
        line = dumps(alert) + b"\n"
        try:
            written = os.write(self._fd, line)
            if written != len(line):
                raise OSError(0, f"short write ({written} of {len(line)} bytes)")
            os.fsync(self._fd)
        except OSError as exc:
            raise DeliveryFailed(f"{self.name}: {exc.strerror or exc}") from None

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

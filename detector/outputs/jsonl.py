"""`file:///PATH.jsonl`: alerts appended to a local file, one JSON object per line.

Each alert is one `write` on an O_APPEND descriptor, so a reader tailing the file (a log
shipper) never sees half a line, and two writers do not interleave inside a line. A batch is
fsynced once after its last line: one fsync per alert would cap a burst at the disk's fsync
rate (a few hundred per second).
"""

from __future__ import annotations

import errno
import os
from collections.abc import Sequence
from urllib.parse import unquote, urlsplit

from hpcsec.detector.core.display import visible_json
from hpcsec.detector.core.private_fs import PrivatePathError, open_private
from hpcsec.detector.outputs.alertjson import alert_bytes
from hpcsec.detector.outputs.protocol import Alert, DeliveryFailed, OutputError


class JsonlOutput:
    durable = False

    def __init__(self, path: str):
        self.path = path
        self.name = f"file://{path}"
        self._fd = -1
        # Opening an output has no side effect: a file that does not exist yet is created by
        # the first alert, so a config that fails later (a reload) leaves no stray file. What
        # would stop the first write is an error now.
        try:
            if os.path.lexists(path):
                self._open()
            else:
                parent = os.path.dirname(path) or "/"
                if not os.path.isdir(parent):
                    raise FileNotFoundError(2, "No such file or directory")
                if not os.access(parent, os.W_OK | os.X_OK):
                    raise PermissionError(13, "Permission denied")
        except OSError as exc:
            raise OutputError(
                f"output {self.name}: cannot open for appending: {exc.strerror}"
            ) from None

    def _open(self) -> None:
        # Created 0600; an existing file must be a regular file of ours: a symlink or a file
        # planted by a node user is refused, never written through.
        try:
            self._fd = open_private(self.path)
        except PrivatePathError as exc:
            raise PermissionError(errno.EPERM, exc.message) from None

    @classmethod
    def from_url(cls, url: str) -> JsonlOutput:
        parts = urlsplit(url)
        if parts.netloc not in ("", "localhost") or not parts.path.startswith("/"):
            raise OutputError(f"output {url!r}: a file output is file:///ABSOLUTE/PATH.jsonl")
        if parts.query or parts.fragment:
            raise OutputError(f"output {url!r}: a file output takes no query or fragment")
        path = unquote(parts.path)
        if not path.endswith((".jsonl", ".ndjson")):
            raise OutputError(
                f"output {url!r}: a file output must end in .jsonl (one JSON alert per line)"
            )
        return cls(path)

    def _write(self, alert: Alert) -> None:
        line = visible_json(alert_bytes(alert)) + b"\n"  # the same JSON, no raw C1 or bidi
        try:
            if self._fd < 0:
                self._open()
            written = os.write(self._fd, line)
            if written != len(line):
                raise OSError(0, f"short write ({written} of {len(line)} bytes)")
        except OSError as exc:
            raise DeliveryFailed(f"{self.name}: {exc.strerror or exc}") from None

    def _sync(self) -> None:
        if self._fd < 0:
            return
        try:
            os.fsync(self._fd)
        except OSError as exc:
            raise DeliveryFailed(f"{self.name}: {exc.strerror or exc}") from None

    def send(self, alert: Alert) -> None:
        self._write(alert)
        self._sync()

    def send_many(self, alerts: Sequence[Alert]) -> list[str | None]:
        """Every alert written, then one fsync; per alert None (on disk) or the error."""
        errors: list[str | None] = []
        for alert in alerts:
            try:
                self._write(alert)
                errors.append(None)
            except DeliveryFailed as exc:
                errors.append(str(exc))
        if any(e is None for e in errors):
            try:
                self._sync()
            except DeliveryFailed as exc:  # written, but not known to be on disk
                errors = [e or str(exc) for e in errors]
        return errors

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

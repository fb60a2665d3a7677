"""`-`: one JSON alert per line on standard output, for pipelines (`hpcsec scan --output -`)."""

from __future__ import annotations

import sys
from typing import TextIO

from hpcsec.detector.core.display import visible_json
from hpcsec.detector.outputs.alertjson import alert_bytes
from hpcsec.detector.outputs.protocol import Alert, DeliveryFailed


class StdoutOutput:
    name = "-"
    durable = False

    def __init__(self, stream: TextIO | None = None):
        self._stream = stream

    def send(self, alert: Alert) -> None:
        stream = self._stream or sys.stdout  # looked up late: tests and pagers swap it
        try:
            # C1 controls, DEL and bidi marks as \\u escapes: a terminal may be reading
            stream.write(visible_json(alert_bytes(alert)).decode() + "\n")
            stream.flush()
        except OSError as exc:
            raise DeliveryFailed(f"stdout: {exc.strerror or exc}") from None

    def close(self) -> None:
        pass

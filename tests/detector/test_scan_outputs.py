"""`hpcsec scan --output`: a down webhook keeps alerts in the spool; a later scan sends them."""

import json
import socket
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer

from hpcsec.detector.cli.main import main
from tests.rule_texts import MINER_RULE

RULE = MINER_RULE


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class _Receiver(BaseHTTPRequestHandler):
    received: list = []

    def do_POST(self):
        body = self.rfile.read(int(self.headers["Content-Length"]))
        type(self).received.append(json.loads(body)["alert.id"])
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args):
        pass


def test_undelivered_alerts_wait_in_the_spool_for_the_next_scan(tmp_path, capsys):
    rules = tmp_path / "gpu_hijack.yml"
    rules.write_text(RULE)
    secret = tmp_path / "secret"
    secret.write_text("s3cret\n")
    events = tmp_path / "e.jsonl"
    events.write_text(
        json.dumps(
            {
                "@timestamp": "2026-11-30T01:00:00Z",
                "event.category": "process",
                "host.name": "n1",
                "process.name": "xmrig",
                "process.pid": 7,
                "user.name": "mallory",
            }
        )
        + "\n"
    )
    port = _free_port()
    url = f"http://127.0.0.1:{port}/hook"
    common = [
        "--no-default-rules",
        "--rules",
        str(rules),
        "--output",
        url,
        "--webhook-secret-file",
        str(secret),
        "--spool",
        str(tmp_path / "spool"),
        "--store",
        str(tmp_path / "a.duckdb"),
    ]
    assert main(["scan", "--events", str(events), *common]) == 1
    err = capsys.readouterr().err
    assert "1 alert(s) not delivered yet, kept in the spool" in err

    _Receiver.received = []
    server = HTTPServer(("127.0.0.1", port), _Receiver)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        empty = tmp_path / "none.jsonl"
        empty.write_text("")
        assert main(["scan", "--events", str(empty), *common]) == 0
    finally:
        server.shutdown()
    assert "delivered 1 alert(s) left in the spool by an earlier run" in capsys.readouterr().err
    assert len(_Receiver.received) == 1
    assert main(["alerts", "--store", str(tmp_path / "a.duckdb"), "--format", "json"]) == 0
    stored = json.loads(capsys.readouterr().out)
    assert [a["alert.id"] for a in stored] == _Receiver.received
    parquet = tmp_path / "events.parquet"
    assert (
        main(["alerts", "--store", str(tmp_path / "a.duckdb"), "--export-events", str(parquet)])
        == 0
    )
    import duckdb

    ((count,),) = duckdb.sql(f"select count(*) from '{parquet}'").fetchall()
    assert count == 1  # the first scan kept the event it evaluated

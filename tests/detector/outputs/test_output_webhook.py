"""Webhook output against a real HTTP server on 127.0.0.1 that verifies every signature.

Delivery is at least once (an alert the receiver took just before a crash is sent again at
the next start); receivers deduplicate on the Idempotency-Key (= alert.id). The checks below
count distinct alert ids AND total posts, so a lost alert and an unexpected duplicate both
fail.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from hpcsec.detector.outputs.protocol import redact
from hpcsec.detector.outputs.registry import open_outputs
from hpcsec.detector.outputs.webhook import parse_retry_after

SECRET = b"s3cret-shared-with-the-receiver"


def verify(secret: bytes, headers, body: bytes, max_age_s: int = 300) -> bool:
    """The receiver-side check documented in docs/outputs.md."""
    timestamp = headers.get("X-Hpcsec-Timestamp", "")
    signature = headers.get("X-Hpcsec-Signature", "")
    if not timestamp.isdigit() or abs(time.time() - int(timestamp)) > max_age_s:
        return False  # missing, or too old: a replay
    expected = (
        "sha256=" + hmac.new(secret, timestamp.encode() + b"." + body, hashlib.sha256).hexdigest()
    )
    return hmac.compare_digest(expected, signature)


class Receiver:
    def __init__(self, port: int = 0):
        self.port = port
        self.lock = threading.Lock()
        self.posts: list[tuple[str, str, float]] = []  # (alert.id, Idempotency-Key, time)
        self.bodies: list[bytes] = []  # of the accepted posts
        self.refused: list[tuple[int, float]] = []
        self.bad_signatures = 0
        self.truncated = 0  # requests cut off by a sender that died while sending
        self.responses: list[tuple[int, dict]] = []  # canned answers for the next requests
        self.delay_s = 0.0
        self.server: ThreadingHTTPServer | None = None

    def start(self) -> Receiver:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:
                pass

            def do_POST(self) -> None:
                length = int(self.headers["Content-Length"])
                body = self.rfile.read(length)
                if len(body) < length:  # the sender died mid-request (kill -9): not a post
                    with receiver.lock:
                        receiver.truncated += 1
                    return
                if receiver.delay_s:
                    time.sleep(receiver.delay_s)
                with receiver.lock:
                    if not verify(SECRET, self.headers, body):
                        receiver.bad_signatures += 1
                        status, extra = 401, {}
                    elif receiver.responses:
                        status, extra = receiver.responses.pop(0)
                        receiver.refused.append((status, time.monotonic()))
                    else:
                        status, extra = 200, {}
                        receiver.bodies.append(body)
                        receiver.posts.append(
                            (
                                json.loads(body)["alert.id"],
                                self.headers["Idempotency-Key"],
                                time.monotonic(),
                            )
                        )
                self.send_response(status)
                for k, v in extra.items():
                    self.send_header(k, v)
                self.send_header("Content-Length", "0")
                self.end_headers()

        self.server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        assert self.server is not None
        self.server.shutdown()
        self.server.server_close()
        self.server = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hpcsec?token=abc"

    def ids(self) -> Counter:
        with self.lock:
            return Counter(p[0] for p in self.posts)


@pytest.fixture
def receiver():
    r = Receiver().start()
    yield r
    if r.server is not None:
        r.stop()


@pytest.fixture
def secret_file(tmp_path):
    path = tmp_path / "webhook.secret"
    path.write_bytes(SECRET + b"\n")  # a trailing newline from `echo` is not part of it
    return str(path)


def alert(n: int, prefix: str = "a") -> dict:
    return {
        "alert.id": f"{prefix}{n:03d}",
        "@timestamp": "2026-11-30T01:00:00.000Z",
        "rule.id": "r-theft",
        "rule.title": "t",
        "rule.level": "high",
        "rule.tags": [],
        "rule.vector": "model_theft",
        "host.name": "gpu-1",
        "events": [],
        "count": 1,
        "alert.summary": "zoë read weights",
    }


def test_signed_post_with_idempotency_key(receiver, secret_file, tmp_path):
    with open_outputs([receiver.url], secret_file=secret_file, spool_dir=str(tmp_path)) as outputs:
        assert outputs.names == [redact(receiver.url)]
        assert outputs.names[0].startswith(f"http://127.0.0.1:{receiver.port}#")  # no token
        report = outputs.deliver([alert(1), alert(2)])
    assert report.complete
    assert [(o.alert_id, o.state) for o in report.outcomes] == [
        ("a001", "delivered"),
        ("a002", "delivered"),
    ]
    assert receiver.bad_signatures == 0
    assert [(p[0], p[1]) for p in receiver.posts] == [("a001", "a001"), ("a002", "a002")]


def test_wrong_secret_is_refused_and_alerts_stay_spooled(receiver, tmp_path):
    wrong = tmp_path / "wrong.secret"
    wrong.write_text("not-the-secret")
    url = redact(receiver.url)
    with open_outputs(
        [receiver.url], secret_file=str(wrong), spool_dir=str(tmp_path / "spool")
    ) as outputs:
        report = outputs.deliver([alert(1)], timeout_s=0)
    assert receiver.bad_signatures == 1 and receiver.posts == []
    # a 401 is a configuration problem, not this alert's: it is kept for a retry
    assert report.destinations[url].pending == 1
    assert report.destinations[url].last_error == "HTTP 401 Unauthorized"


def test_outage_then_flush_delivers_each_alert_exactly_once(receiver, secret_file, tmp_path):
    spool = str(tmp_path / "spool")
    url = redact(receiver.url)
    with open_outputs([receiver.url], secret_file=secret_file, spool_dir=spool) as outputs:
        assert outputs.deliver([alert(i) for i in range(3)]).complete
        receiver.stop()
        report = outputs.deliver([alert(i) for i in range(3, 10)], timeout_s=0.5)
        assert report.destinations[url].pending == 7
        assert "ConnectError" in report.destinations[url].last_error
        assert outputs.spool_depth() == {url: 7}
        receiver.start()
        report = outputs.flush(timeout_s=30)
        assert report.destinations[url].delivered == 7
        assert outputs.spool_depth() == {url: 0}
    assert receiver.ids() == Counter({f"a{i:03d}": 1 for i in range(10)})
    assert receiver.bad_signatures == 0


def test_429_retry_after_and_5xx_are_retried(receiver, secret_file, tmp_path):
    receiver.responses = [(503, {}), (429, {"Retry-After": "1"})]
    with open_outputs([receiver.url], secret_file=secret_file, spool_dir=str(tmp_path)) as outputs:
        report = outputs.deliver([alert(1)], timeout_s=30)
    assert report.complete
    assert [status for status, _ in receiver.refused] == [503, 429]
    ((_, _, accepted_at),) = receiver.posts
    assert accepted_at - receiver.refused[1][1] >= 1.0  # waited as long as it was asked


def test_a_refused_alert_is_moved_aside_and_reported(receiver, secret_file, tmp_path):
    receiver.responses = [(422, {})]
    url = redact(receiver.url)
    with open_outputs(
        [receiver.url], secret_file=secret_file, spool_dir=str(tmp_path / "spool")
    ) as outputs:
        report = outputs.deliver([alert(1), alert(2)])
    d = report.destinations[url]
    assert (d.delivered, d.pending, d.failed) == (1, 0, 1)
    assert report.problems() == [
        f"{url}: 1 alert(s) failed and will not be retried (HTTP 422 Unprocessable Entity)"
    ]
    (failed_dir,) = [p / "failed" for p in (tmp_path / "spool").iterdir()]
    reasons = [p.read_text() for p in failed_dir.glob("*.reason")]
    assert reasons == ["HTTP 422 Unprocessable Entity\n"]


CHILD = """
import sys
from hpcsec.detector.outputs.protocol import redact
from hpcsec.detector.outputs.registry import open_outputs
url, secret, spool, n = sys.argv[1:5]
alerts = [{"alert.id": f"k{i:03d}", "rule.id": "r", "rule.level": "high", "events": [],
           "count": 1} for i in range(int(n))]
with open_outputs([url], secret_file=secret, spool_dir=spool) as outputs:
    outputs.deliver(alerts, timeout_s=0)  # on disk before the first attempt
    print("spooled", flush=True)
    while True:
        outputs.flush(timeout_s=60)
"""


def run_child(url: str, secret_file: str, spool: str, n: int) -> subprocess.Popen:
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, url, secret_file, spool, str(n)],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert child.stdout.readline() == "spooled\n"
    return child


def kill9(child: subprocess.Popen) -> None:
    os.kill(child.pid, signal.SIGKILL)
    assert child.wait(timeout=10) == -signal.SIGKILL


def test_kill_9_while_the_receiver_is_down_loses_nothing(receiver, secret_file, tmp_path):
    spool = str(tmp_path / "spool")
    receiver.stop()
    child = run_child(receiver.url, secret_file, spool, 30)
    kill9(child)
    receiver.start()
    with open_outputs([receiver.url], secret_file=secret_file, spool_dir=spool) as outputs:
        report = outputs.flush(timeout_s=30)
    assert report.complete
    assert receiver.ids() == Counter({f"k{i:03d}": 1 for i in range(30)})


def test_kill_9_in_the_middle_of_delivery_loses_nothing(receiver, secret_file, tmp_path):
    spool = str(tmp_path / "spool")
    receiver.delay_s = 0.02
    child = run_child(receiver.url, secret_file, spool, 60)
    deadline = time.monotonic() + 30
    while len(receiver.posts) < 10 and time.monotonic() < deadline:
        time.sleep(0.01)
    kill9(child)
    sent_before = len(receiver.posts)
    assert 10 <= sent_before < 60  # killed mid-way, as intended
    receiver.delay_s = 0
    with open_outputs([receiver.url], secret_file=secret_file, spool_dir=spool) as outputs:
        assert outputs.flush(timeout_s=30).complete
    ids = receiver.ids()
    assert set(ids) == {f"k{i:03d}" for i in range(60)}
    # at most the one alert in flight at the kill is sent twice; the key lets receivers drop it
    assert sum(ids.values()) - 60 <= 1
    assert receiver.bad_signatures == 0


def test_parse_retry_after():
    assert parse_retry_after("7") == 7.0
    assert parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT", now=1445412470.0) == 10.0
    assert parse_retry_after("soon") is None
    assert parse_retry_after(None) is None


def test_backoff_grows_with_jitter_up_to_the_cap_and_retry_after_wins():
    from hpcsec.detector.outputs.delivery import RetryPolicy

    policy = RetryPolicy(base_s=0.5, cap_s=60.0, max_retry_after_s=3600.0)
    for failures, ceiling in ((1, 0.5), (2, 1.0), (3, 2.0), (8, 60.0), (30, 60.0)):
        waits = {policy.delay(failures) for _ in range(200)}
        assert all(ceiling / 2 <= w <= ceiling for w in waits)
        assert len(waits) > 100  # random, not one fixed step
    assert policy.delay(5, retry_after=7.0) == 7.0
    assert policy.delay(1, retry_after=86400.0) == 3600.0
    assert policy.delay(1, retry_after=-3.0) == 0.0

"""Alert delivery speed: sustained alerts/s to local receivers, through the durable spool.

    python -m bench.outputs [--alerts N] [--batch N] [--spool-dir DIR]

For each destination (a signed webhook to an HTTP server that checks every signature, and
syslog over TCP to a reader of octet-counted frames), both receivers in their own process
so they do not share the sender's interpreter:
1. `OutputSet.deliver` in batches of --batch alerts: spool commit (one fsync per batch),
   send, settle; what the agent and `hpcsec scan` do. alerts/s.
2. The same output's `send` in a loop with no spool: the peer, so the spool's share shows
   as a ratio.
The receivers' counts are checked: a figure for alerts that did not arrive is not printed.
The spool lives in a temporary directory unless --spool-dir names one (put it on the disk
the agent's spool will use: fsync cost is the disk's).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time

from hpcsec.detector.outputs.delivery import OutputSet
from hpcsec.detector.outputs.protocol import OutputOptions
from hpcsec.detector.outputs.registry import open_output

SECRET = b"bench-secret"

WEBHOOK_RECEIVER = r"""
import hashlib, hmac, sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
secret = sys.argv[1].encode()
count = bad = 0

class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as a real receiver would

    def log_message(self, *args):
        pass

    def do_POST(self):
        global count, bad
        body = self.rfile.read(int(self.headers["Content-Length"]))
        ts = self.headers["X-Hpcsec-Timestamp"]
        mac = hmac.new(secret, ts.encode() + b"." + body, hashlib.sha256).hexdigest()
        if hmac.compare_digest("sha256=" + mac, self.headers["X-Hpcsec-Signature"]):
            count += 1
        else:
            bad += 1
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def do_GET(self):  # the bench asks for the counts
        data = f"{count} {bad}".encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
print(server.server_address[1], flush=True)
server.serve_forever()
"""

SYSLOG_RECEIVER = r"""
import socket, sys, threading
listener = socket.create_server(("127.0.0.1", 0))
print(listener.getsockname()[1], flush=True)
count = 0
lock = threading.Lock()

def read(conn):
    global count
    buf = b""
    with conn:
        while chunk := conn.recv(1 << 20):
            buf += chunk
            while True:  # RFC 6587 octet counting: LEN SP MSG
                length, sep, rest = buf.partition(b" ")
                if not sep or len(rest) < int(length):
                    break
                buf = rest[int(length):]
                with lock:
                    count += 1

def answer_counts():
    for line in sys.stdin:
        with lock:
            print(count, flush=True)

threading.Thread(target=answer_counts, daemon=True).start()
while True:
    conn, _ = listener.accept()
    threading.Thread(target=read, args=(conn,), daemon=True).start()
"""


def make_alert(n: int) -> dict:
    """About the size of a real file-access alert: the alert fields plus two events."""
    event = {
        "@timestamp": "2026-11-30T01:00:00.000Z",
        "event.id": f"e{n}",
        "event.kind": "event",
        "event.category": "file_access",
        "event.action": "read",
        "host.name": "gpu-017",
        "hpcsec.sensor": "file_access",
        "process.pid": 41000 + n,
        "process.name": "rclone",
        "process.executable": "/usr/bin/rclone",
        "process.command_line": "rclone copy /lustre/models/llama-70b remote:bucket",
        "user.name": "eve",
        "user.id": 1234,
        "file.path": f"/lustre/models/llama-70b/model-{n % 30:05d}-of-00030.safetensors",
        "slurm.job.id": "4242",
        "slurm.job.account": "ml-research",
        "hpcsec.asset.name": "llama-70b",
        "hpcsec.asset.read_allowed": False,
    }
    return {
        "alert.id": f"{n:032x}",
        "@timestamp": event["@timestamp"],
        "rule.id": "6f1d2c3b-0a9e-4c1d-8e7f-112233445566",
        "rule.title": "Model weights read by an account that may not read them",
        "rule.level": "high",
        "rule.tags": ["attack.collection", "attack.t1005"],
        "rule.vector": "model_theft",
        "host.name": "gpu-017",
        "slurm.job.id": "4242",
        "user.name": "eve",
        "process.pid": event["process.pid"],
        "process.name": "rclone",
        "alert.summary": f"eve read {event['file.path']} with rclone in job 4242",
        "alert.first_seen": event["@timestamp"],
        "alert.last_seen": event["@timestamp"],
        "events": [event, {**event, "event.id": f"e{n}b"}],
        "count": 2,
    }


class Receiver:
    def __init__(self, script: str, *args: str):
        self.proc = subprocess.Popen(
            [sys.executable, "-c", script, *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        self.port = int(self.proc.stdout.readline())

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait()


def webhook_count(port: int) -> tuple[int, int]:
    import httpx

    good, bad = httpx.get(f"http://127.0.0.1:{port}/").text.split()
    return int(good), int(bad)


def syslog_count(receiver: Receiver, expected: int) -> int:
    deadline = time.monotonic() + 10  # TCP hands data over asynchronously: let it arrive
    while True:
        receiver.proc.stdin.write("\n")
        receiver.proc.stdin.flush()
        got = int(receiver.proc.stdout.readline())
        if got >= expected or time.monotonic() > deadline:
            return got
        time.sleep(0.05)


def through_spool(
    url: str, options: OutputOptions, alerts: list[dict], batch: int, spool_root: str
) -> float:
    spool = tempfile.mkdtemp(prefix="hpcsec-bench-spool-", dir=spool_root)
    try:
        outputs = OutputSet([open_output(url, options)], spool, 1 << 30)
        with outputs:
            start = time.perf_counter()
            for i in range(0, len(alerts), batch):
                report = outputs.deliver(alerts[i : i + batch], timeout_s=60)
                if not report.complete:
                    raise SystemExit(f"{url}: delivery incomplete: {report.problems()}")
            return time.perf_counter() - start
    finally:
        shutil.rmtree(spool, ignore_errors=True)


def direct(url: str, options: OutputOptions, alerts: list[dict]) -> float:
    output = open_output(url, options)
    try:
        start = time.perf_counter()
        for alert in alerts:
            output.send(alert)
        return time.perf_counter() - start
    finally:
        output.close()


def report(name: str, n: int, spooled_s: float, direct_s: float) -> None:
    spooled, plain = n / spooled_s, n / direct_s
    print(
        f"{name:12s} spooled {spooled:9,.0f} alerts/s   send only {plain:9,.0f} alerts/s   "
        f"spool costs {100 * (1 - spooled / plain):4.1f} % of the rate"
    )


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.outputs", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--alerts", type=int, default=3000)
    parser.add_argument("--batch", type=int, default=100, help="alerts per deliver() call")
    parser.add_argument("--spool-dir", default=None, help="where the temporary spools go")
    args = parser.parse_args(argv)
    n = args.alerts
    alerts = [make_alert(i) for i in range(n)]
    second = [make_alert(n + i) for i in range(n)]
    size = sum(len(repr(a)) for a in alerts[:100]) // 100
    print(
        f"{n} alerts of about {size} bytes each, batches of {args.batch}, {os.cpu_count()} CPU(s)"
    )

    with tempfile.TemporaryDirectory() as tmp:
        secret = os.path.join(tmp, "secret")
        with open(secret, "wb") as fh:
            fh.write(SECRET)
        options = OutputOptions(secret_file=secret)

        hook = Receiver(WEBHOOK_RECEIVER, SECRET.decode())
        try:
            url = f"http://127.0.0.1:{hook.port}/hook"
            spooled_s = through_spool(url, options, alerts, args.batch, args.spool_dir or tmp)
            direct_s = direct(url, options, second)
            good, bad = webhook_count(hook.port)
            if (good, bad) != (2 * n, 0):
                print(
                    f"webhook: receiver verified {good} and refused {bad} of {2 * n}",
                    file=sys.stderr,
                )
                return 1
            report("webhook", n, spooled_s, direct_s)
        finally:
            hook.stop()

        log = Receiver(SYSLOG_RECEIVER)
        try:
            url = f"syslog+tcp://127.0.0.1:{log.port}"
            spooled_s = through_spool(url, options, alerts, args.batch, args.spool_dir or tmp)
            direct_s = direct(url, options, second)
            got = syslog_count(log, 2 * n)
            if got != 2 * n:
                print(f"syslog+tcp: receiver got {got} of {2 * n} messages", file=sys.stderr)
                return 1
            report("syslog+tcp", n, spooled_s, direct_s)
        finally:
            log.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""Syslog output: RFC 5424 to a real rsyslogd (UDP, TCP with octet counting, and TLS when
Debian's rsyslog-gnutls is installed), and TLS to a Python ssl server with a certificate made
by the openssl CLI (certificate checks, framing of raw bytes)."""

from __future__ import annotations

import json
import shutil
import socket
import ssl
import subprocess
import threading
import time
import uuid
from pathlib import Path

import pytest

from hpcsec.detector.outputs.cef import CEF_PRODUCT_VERSION
from hpcsec.detector.outputs.protocol import DeliveryFailed, OutputOptions
from hpcsec.detector.outputs.registry import open_outputs
from hpcsec.detector.outputs.syslog import SyslogOutput, octet_frame
from tests.detector.outputs.sample_alerts import SD_EXPECTED, make_alert
from tests.ports import bound_port

RSYSLOGD = shutil.which("rsyslogd") or shutil.which("rsyslogd", path="/usr/sbin:/sbin")
# rsyslog's TLS driver (Debian package rsyslog-gnutls), next to its other modules
GTLS_DRIVER = any(
    Path(d).glob("lmnsd_gtls.so")
    for d in (
        "/usr/lib/x86_64-linux-gnu/rsyslog",
        "/usr/lib/aarch64-linux-gnu/rsyslog",
        "/usr/lib/rsyslog",
        "/usr/lib64/rsyslog",
    )
)
# Every field rsyslog parsed out of the message, one JSON object per line.
TEMPLATE = (
    '{"raw":"%rawmsg:::json%","severity":"%syslogseverity%","facility":'
    '"%syslogfacility%","msgid":"%msgid%","app":"%app-name%","procid":"%procid%",'
    '"sd":"%structured-data:::json%","msg":"%msg:::json%","version":'
    '"%protocol-version%"}\\n'
)


def complete_lines(path: Path) -> list[str]:
    """The lines rsyslog has finished writing to `path`.

    omfile writes through a buffer (ioBufferSize, 4 KiB by default) and writes it out when it
    is full, which can be in the middle of a record: two records of ~2 KiB in one batch end the
    first write() inside the second. Until the rest arrives, the file ends in a partial line
    (possibly inside a UTF-8 character): only what ends in a newline is a record."""
    data = path.read_bytes() if path.exists() else b""
    return data[: data.rfind(b"\n") + 1].decode("utf-8").splitlines()


def free_port(kind: int) -> int:
    with socket.socket(socket.AF_INET, kind) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Rsyslog:
    """rsyslogd of the tests: its own config, ports, pid file and output; never the system's.
    With `tls` (certificate, key) its TCP input speaks RFC 5425 TLS instead of plain TCP."""

    def __init__(
        self, workdir: Path, tls: tuple[Path, Path] | None = None, max_message_size: str = "64k"
    ):
        self.workdir = workdir
        self.udp, self.tcp = free_port(socket.SOCK_DGRAM), free_port(socket.SOCK_STREAM)
        self.out = workdir / "received.jsonl"
        conf = workdir / "rsyslog.conf"
        template = TEMPLATE.replace('"', '\\"')
        tls_global = tls_module = ""
        if tls is not None:
            tls_global = (
                f'defaultNetstreamDriverCAFile="{tls[0]}" '
                f'defaultNetstreamDriverCertFile="{tls[0]}" '
                f'defaultNetstreamDriverKeyFile="{tls[1]}"'
            )
            tls_module = (
                ' streamDriver.name="gtls" streamDriver.mode="1" streamDriver.authMode="anon"'
            )
        # No imuxsock/imklog: only our loopback inputs, nothing from the host's own logging.
        conf.write_text(f"""
global(workDirectory="{workdir}" parser.escapeControlCharactersOnReceive="off"
       maxMessageSize="{max_message_size}" net.enableDNS="off" {tls_global})
module(load="imudp")
module(load="imtcp"{tls_module})
input(type="imudp" address="127.0.0.1" port="{self.udp}")
input(type="imtcp" address="127.0.0.1" port="{self.tcp}")
template(name="fields" type="string" string="{template}")
action(type="omfile" file="{self.out}" template="fields")
""")
        self.proc = subprocess.Popen(
            [RSYSLOGD, "-n", "-f", str(conf), "-i", str(workdir / "rsyslogd.pid")],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        self._wait_ready()

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + 20
        probe = f"<14>1 - - probe - - - ready-{uuid.uuid4().hex}".encode()
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as udp:
            while time.monotonic() < deadline:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"rsyslogd exited: {self.proc.stdout.read().decode()}")
                udp.sendto(probe, ("127.0.0.1", self.udp))
                if any(probe.split()[-1].decode() in line for line in complete_lines(self.out)):
                    try:
                        socket.create_connection(("127.0.0.1", self.tcp), timeout=1).close()
                        return
                    except OSError:
                        pass
                time.sleep(0.1)
        raise RuntimeError("rsyslogd did not come up")

    def records(self, marker: str, n: int) -> list[dict]:
        """The first n records whose raw message contains marker, waiting for them."""
        deadline = time.monotonic() + 15
        while True:
            found = [json.loads(line) for line in complete_lines(self.out) if marker in line]
            if len(found) >= n or time.monotonic() > deadline:
                return found
            time.sleep(0.05)

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=10)


def test_a_record_rsyslog_is_still_writing_is_not_read(tmp_path):
    out = tmp_path / "received.jsonl"
    assert complete_lines(out) == []
    whole = json.dumps({"msg": "zoë"}, ensure_ascii=False)
    out.write_bytes(whole.encode() + b"\n" + whole.encode()[:-3])  # cut inside the ë
    assert complete_lines(out) == [whole]
    out.write_bytes(whole.encode() + b"\n" + whole.encode() + b"\n")
    assert complete_lines(out) == [whole, whole]


@pytest.fixture(scope="module")
def rsyslog(tmp_path_factory):
    if RSYSLOGD is None:
        pytest.skip("rsyslogd not installed (Debian package rsyslog; `make system-deps`)")
    server = Rsyslog(tmp_path_factory.mktemp("rsyslog"))
    yield server
    server.stop()


@pytest.fixture(scope="module")
def rsyslog_tls(tmp_path_factory):
    if RSYSLOGD is None:
        pytest.skip("rsyslogd not installed (Debian package rsyslog; `make system-deps`)")
    if not GTLS_DRIVER:
        pytest.skip("rsyslog's TLS driver not installed (Debian package rsyslog-gnutls)")
    workdir = tmp_path_factory.mktemp("rsyslog-tls")
    cert = make_cert(workdir)
    server = Rsyslog(workdir, tls=cert)
    server.cert = cert[0]
    yield server
    server.stop()


@pytest.mark.rsyslog
def test_udp_json_body_severity_and_structured_data(rsyslog, tmp_path):
    marker = uuid.uuid4().hex
    alerts = [
        make_alert(marker, i, level)
        for i, level in enumerate(("critical", "high", "medium", "low", "informational"))
    ]
    with open_outputs(
        [f"syslog+udp://127.0.0.1:{rsyslog.udp}"], spool_dir=str(tmp_path)
    ) as outputs:
        report = outputs.deliver(alerts)
    assert report.destinations[f"syslog+udp://127.0.0.1:{rsyslog.udp}"].delivered == 5
    got = sorted(rsyslog.records(marker, 5), key=lambda r: json.loads(r["msg"])["alert.id"])
    assert [r["severity"] for r in got] == ["2", "3", "4", "5", "6"]
    assert {r["facility"] for r in got} == {"10"}  # authpriv
    for record, sent in zip(got, alerts, strict=True):
        assert record["version"] == "1"
        assert record["app"] == "hpcsec"
        assert record["msgid"] == "6f1d2c3b0a9e4c1d8e7f112233445566"
        assert record["sd"] == SD_EXPECTED.format(id=sent["alert.id"], level=sent["rule.level"])
        assert json.loads(record["msg"]) == sent
        assert record["raw"].startswith(
            f"<{10 * 8 + int(record['severity'])}>1 2026-11-30T01:02:03.456Z "
        )


@pytest.mark.rsyslog
def test_tcp_octet_counting_keeps_messages_intact(rsyslog, tmp_path):
    marker = uuid.uuid4().hex
    url = f"syslog+tcp://127.0.0.1:{rsyslog.tcp}?facility=local3"
    alerts = [make_alert(marker, i, **{"rule.title": f"title {i}\nsecond line"}) for i in range(3)]
    with open_outputs([url], spool_dir=str(tmp_path)) as outputs:
        assert outputs.deliver(alerts).complete
        # The framing carries any byte: a raw newline inside one message must not split it.
        lane_output = outputs.outputs[0]
        lane_output.transport.send(
            octet_frame(f"<13>1 - - probe - - - {marker} line one\nline two".encode())
        )
        outputs.deliver([make_alert(marker, 3)])
    got = rsyslog.records(marker, 5)
    assert len(got) == 5
    bodies = [r["msg"] for r in got]
    assert f"{marker} line one\nline two" in bodies
    parsed = [json.loads(r["msg"]) for r in got if r["app"] == "hpcsec"]
    assert sorted(a["alert.id"] for a in parsed) == [f"{marker}-{i}" for i in range(4)]
    assert {r["facility"] for r in got if r["app"] == "hpcsec"} == {"19"}
    assert parsed[0]["rule.title"].endswith("\nsecond line")


@pytest.mark.rsyslog
def test_tcp_cef_body(rsyslog, tmp_path):
    marker = uuid.uuid4().hex
    url = f"syslog+tcp://127.0.0.1:{rsyslog.tcp}?format=cef"
    with open_outputs([url], spool_dir=str(tmp_path)) as outputs:
        assert outputs.deliver(
            [
                make_alert(
                    marker,
                    0,
                    "critical",
                    **{"rule.title": "a|b", "alert.summary": f"{marker} x=1\nnext"},
                )
            ]
        ).complete
        # UTF-8 CEF: the BOM RFC 5424 6.4 asks for, which rsyslog keeps in the message
        assert outputs.deliver(
            [
                make_alert(
                    marker, 1, "low", **{"user.name": "zoë", "alert.summary": f"{marker} ünïcode"}
                )
            ]
        ).complete
    ascii_record, utf8_record = sorted(rsyslog.records(marker, 2), key=lambda r: r["severity"])
    assert utf8_record["severity"] == "5"
    assert utf8_record["msg"].startswith(f"\ufeffCEF:0|hpcsec|hpcsec|{CEF_PRODUCT_VERSION}|")
    assert " duser=zoë " in utf8_record["msg"]
    assert utf8_record["msg"].endswith(f" msg={marker} ünïcode")
    record = ascii_record
    assert record["severity"] == "2"
    assert record["msg"] == (
        f"CEF:0|hpcsec|hpcsec|{CEF_PRODUCT_VERSION}|6f1d2c3b-0a9e-4c1d-8e7f-112233445566|a\\|b|10|"
        f"rt=1796000523456 externalId={marker}-0 cat=model_theft dvchost=gpu-017 "
        'duser=eve "x"]\\\\ dpid=31337 dproc=rclone cnt=3 start=1796000523456 '
        "end=1796000640000 cs1Label=slurmJobId cs1=4242 "
        "cs3Label=tags cs3=attack.exfiltration,attack.t1005 "
        f"msg={marker} x\\=1\\nnext"
    )


def test_receiver_down_keeps_alerts_spooled_until_it_is_back(tmp_path):
    held = bound_port()  # the receiver's port, refusing until it listens
    port = held.getsockname()[1]
    url = f"syslog+tcp://127.0.0.1:{port}"
    alert = make_alert("down", 0)
    with open_outputs([url], spool_dir=str(tmp_path)) as outputs:
        report = outputs.deliver([alert], timeout_s=0)
        assert report.destinations[url].pending == 1
        assert "Connection refused" in report.destinations[url].last_error
    received = []
    held.listen()
    with held as server:

        def accept() -> None:
            conn, _ = server.accept()
            with conn:
                data = b""
                while chunk := conn.recv(65536):
                    data += chunk
                received.append(data)

        t = threading.Thread(target=accept)
        t.start()
        with open_outputs([url], spool_dir=str(tmp_path)) as outputs:
            assert outputs.flush(timeout_s=10).destinations[url].delivered == 1
        t.join(timeout=10)
    length, _, message = received[0].partition(b" ")
    assert int(length) == len(message)
    assert json.loads(message.split(b"] ", 1)[1]) == alert


def make_cert(tmp_path: Path) -> tuple[Path, Path]:
    if shutil.which("openssl") is None:
        pytest.skip("openssl CLI not installed")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "1",
            "-subj",
            "/CN=localhost",
            "-addext",
            "subjectAltName=IP:127.0.0.1",
            "-keyout",
            str(key),
            "-out",
            str(cert),
        ],
        check=True,
        capture_output=True,
    )
    return cert, key


def read_frames(data: bytes) -> list[bytes]:
    frames = []
    while data:
        length, _, rest = data.partition(b" ")
        frames.append(rest[: int(length)])
        data = rest[int(length) :]
    return frames


def test_tls_with_octet_counting_and_certificate_check(tmp_path):
    cert, key = make_cert(tmp_path)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    received = bytearray()
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]

    def serve() -> None:
        for _ in range(2):  # the first client is the one that must fail verification
            raw, _ = listener.accept()
            try:
                with context.wrap_socket(raw, server_side=True) as conn:
                    while chunk := conn.recv(65536):
                        received.extend(chunk)
            except (ssl.SSLError, OSError):
                continue

    t = threading.Thread(target=serve)
    t.start()
    try:
        untrusted = SyslogOutput.from_url(f"syslog+tls://127.0.0.1:{port}", OutputOptions())
        with pytest.raises(DeliveryFailed, match="CERTIFICATE_VERIFY_FAILED"):
            untrusted.send(make_alert("tls", 0))
        untrusted.close()
        url = f"syslog+tls://127.0.0.1:{port}?ca={cert}"
        alerts = [make_alert("tls", i, **{"alert.summary": "multi\nline"}) for i in range(3)]
        with open_outputs([url], spool_dir=str(tmp_path / "spool")) as outputs:
            report = outputs.deliver(alerts)
            assert report.destinations[f"syslog+tls://127.0.0.1:{port}"].delivered == 3
    finally:
        t.join(timeout=10)
        listener.close()
    frames = read_frames(bytes(received))
    assert [json.loads(f.split(b"] ", 1)[1]) for f in frames] == alerts
    assert all(f.startswith(b"<83>1 2026-11-30T01:02:03.456Z ") for f in frames)


def test_an_alert_too_big_for_one_datagram_is_cut_to_fit_not_refused(tmp_path):
    receiver = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    receiver.bind(("127.0.0.1", 0))
    receiver.settimeout(5)
    url = f"syslog+udp://127.0.0.1:{receiver.getsockname()[1]}"
    huge = make_alert("big", 0, **{"process.command_line": "x" * 100_000})
    with receiver, open_outputs([url + "?max_bytes=200000"], spool_dir=str(tmp_path)) as out:
        report = out.deliver([huge, make_alert("big", 1)])
        datagrams = [receiver.recv(70_000) for _ in range(2)]
    d = report.destinations[url]
    assert (d.delivered, d.pending, d.failed) == (2, 0, 0)
    assert 60_000 < len(datagrams[0]) <= 65_507  # max_bytes above what UDP carries: UDP's limit
    cut = json.loads(datagrams[0].split(b"] ", 1)[1])
    assert cut["alert.truncated"] is True
    assert cut["process.command_line"].endswith(
        f"...[cut 100000->{cut['process.command_line'].index('.')}]"
    )
    assert json.loads(datagrams[1].split(b"] ", 1)[1]) == make_alert("big", 1)


@pytest.mark.rsyslog
def test_tls_to_rsyslog(rsyslog_tls, tmp_path):
    marker = uuid.uuid4().hex
    url = f"syslog+tls://127.0.0.1:{rsyslog_tls.tcp}?ca={rsyslog_tls.cert}"
    alerts = [
        make_alert(marker, i, level, **{"alert.summary": f"{marker}\nsecond line"})
        for i, level in enumerate(("critical", "low"))
    ]
    with open_outputs([url], spool_dir=str(tmp_path)) as outputs:
        assert outputs.deliver(alerts).complete
    got = sorted(rsyslog_tls.records(marker, 2), key=lambda r: r["severity"])
    assert [r["severity"] for r in got] == ["2", "5"]
    for record, sent in zip(got, alerts, strict=True):
        assert record["sd"] == SD_EXPECTED.format(id=sent["alert.id"], level=sent["rule.level"])
        assert json.loads(record["msg"]) == sent
        assert record["msgid"] == "6f1d2c3b0a9e4c1d8e7f112233445566"

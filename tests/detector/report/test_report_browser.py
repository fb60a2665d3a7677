"""The report in a real browser: Debian's Chromium, headless. The page must render with no
console message (a CSP violation or a script error is one), show every vector of the demo,
and keep hostile node strings as text. A screenshot is left in the test's tmp_path."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from hpcsec.detector.cli.main import main
from tests.detector.report.test_report_page import HOSTILE_USER, hostile_events

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = pytest.mark.skipif(
    CHROMIUM is None, reason="chromium is not installed (`make system-deps` installs it as root)"
)
DEMO_VECTORS = (
    "data_poisoning",
    "firmware_drift",
    "gpu_hijack",
    "isolation_escape",
    "model_theft",
    "rdma_abuse",
)
# Chromium logs each console message (console.*, CSP violations, script errors) as CONSOLE
CONSOLE = re.compile(r":CONSOLE[:(]")


def chromium(page: Path, *args: str) -> subprocess.CompletedProcess[str]:
    assert CHROMIUM is not None
    command = [
        CHROMIUM,
        "--headless",
        "--no-sandbox",  # the tests run as root
        "--disable-gpu",
        "--enable-logging=stderr",
        "--v=0",
        f"--user-data-dir={page.parent / 'chromium-profile'}",
        *args,
        page.as_uri(),
    ]
    return subprocess.run(command, capture_output=True, text=True, timeout=120, check=True)


def console_messages(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if CONSOLE.search(line)]


def test_the_console_check_sees_a_blocked_script(tmp_path):
    bad = tmp_path / "bad.html"
    bad.write_text(
        '<!DOCTYPE html><html><head><meta http-equiv="Content-Security-Policy" '
        "content=\"default-src 'none'\"></head><body><script>1</script></body></html>"
    )
    assert console_messages(chromium(bad, "--dump-dom").stderr)


def test_demo_report_renders_without_console_messages_and_shows_every_vector(tmp_path):
    page = tmp_path / "demo.html"
    assert main(["report", "--demo", "-o", str(page)]) == 0
    dom = chromium(page, "--dump-dom")
    assert console_messages(dom.stderr) == []
    for vector in DEMO_VECTORS:
        assert vector in dom.stdout
    assert dom.stdout.count("<svg") == 2 and "<details open" in dom.stdout
    shot = tmp_path / "report.png"
    result = chromium(page, "--hide-scrollbars", f"--screenshot={shot}", "--window-size=1400,2000")
    assert console_messages(result.stderr) == []
    assert shot.read_bytes().startswith(b"\x89PNG\r\n\x1a\n") and shot.stat().st_size > 10_000
    print(f"report screenshot: {shot}")


def test_a_hostile_user_name_renders_as_text(tmp_path):
    events = tmp_path / "events.jsonl"
    hostile_events(events)
    page = tmp_path / "hostile.html"
    assert main(["report", "--events", str(events), "-o", str(page)]) == 0
    dom = chromium(page, "--dump-dom")
    assert console_messages(dom.stderr) == []  # nothing tried to run or load
    assert "<script" not in dom.stdout and "<iframe" not in dom.stdout
    assert '&lt;script&gt;alert("x")&lt;/script&gt;' in dom.stdout
    assert HOSTILE_USER not in dom.stdout

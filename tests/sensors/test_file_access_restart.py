"""A responder that dies is started again: the agent reports the restart as a status event
the self-health rules match, and opens of protected files by another user are seen again."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import pytest
import slurm_harness

from hpcsec.detector.engine.evaluate import Engine
from hpcsec.detector.engine.loader import bundled_rules_dir, load_rules
from hpcsec.sensors.base import FsRoot, SensorContext
from hpcsec.sensors.file_access.restart import MAX_PER_MINUTE, RestartPolicy
from hpcsec.sensors.file_access.sensor import FileAccessSensor

root_only = pytest.mark.skipif(os.geteuid() != 0, reason="fanotify and runuser need root")
RESTARTED_RULE = "b83f2d61-5c4e-4a7f-9e1b-3d6a8c0f2e57"  # File access responder restarted


@pytest.fixture
def shard():
    slurm_harness.ensure_users()
    top = Path(tempfile.mkdtemp(prefix="hpcsec-restart-"))
    top.chmod(0o755)
    (top / "model").mkdir(mode=0o755)
    path = top / "model" / "shard-0.safetensors"
    path.write_bytes(b"s" * 128)
    path.chmod(0o644)
    yield path
    shutil.rmtree(top, ignore_errors=True)


def _cat_as_alice(path: Path) -> None:
    cat = subprocess.run(
        ["runuser", "-u", "alice", "--", "cat", str(path)], capture_output=True, timeout=5
    )
    assert cat.returncode == 0


def _collect_until(sensor, ctx, wanted, timeout_s=15.0) -> list[dict]:
    seen: list[dict] = []
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        seen += list(sensor.collect(ctx))
        if any(wanted(e) for e in seen):
            return seen
        time.sleep(0.05)
    raise AssertionError(f"not seen in {timeout_s} s: {[e.get('event.action') for e in seen]}")


@root_only
def test_a_killed_responder_is_restarted_and_opens_are_seen_again(shard: Path):
    ctx = SensorContext(
        "node",
        FsRoot("sys", "/sys"),
        FsRoot("proc", "/proc"),
        FsRoot("etc", "/etc"),
        options={"watch": [str(shard.parent)], "stream": True},
    )
    sensor = FileAccessSensor()
    try:
        list(sensor.collect(ctx))
        watch = sensor._watch
        first = watch.responder_pid

        def by_alice(e):
            return (e.get("user.name"), e.get("event.action"), e.get("file.path")) == (
                "alice",
                "open",
                str(shard),
            )

        _cat_as_alice(shard)
        _collect_until(sensor, ctx, by_alice)
        os.kill(first, signal.SIGKILL)
        restarted = _collect_until(
            sensor, ctx, lambda e: e.get("event.action") == "responder_restarted"
        )
        assert watch.responder_pid not in (None, first)
        _cat_as_alice(shard)
        _collect_until(sensor, ctx, by_alice)
    finally:
        sensor.close()
    (status,) = [e for e in restarted if e["event.action"] == "responder_restarted"]
    assert status["hpcsec.sensor"] == "file_access" and status["hpcsec.restarts"] == 1
    engine = Engine(load_rules([bundled_rules_dir() / "self_health.yml"]))
    assert [m.rule.id for m in engine.evaluate([status])] == [RESTARTED_RULE]


def test_restarts_back_off_and_are_bounded_per_minute():
    now = [1000.0]
    policy = RestartPolicy(clock=lambda: now[0])
    assert policy.take() is False  # nothing lost, nothing due
    delays = []
    for _ in range(MAX_PER_MINUTE + 1):
        policy.lost()
        delays.append(policy.due_at - now[0])
        assert policy.take() is False  # not before its time
        now[0] = policy.due_at
        assert policy.take() is True
    assert delays[:3] == pytest.approx([0.1, 0.2, 0.4])  # backoff
    # the sixth attempt in a minute waits until the first leaves the minute
    assert now[0] >= 1000.0 + 0.1 + 60.0

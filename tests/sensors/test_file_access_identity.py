"""Protected files are recognised by identity, whatever path an unprivileged user reads
them through: a bind mount made in a user namespace, a hard link, a symlink, `..`."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest
import slurm_harness

from hpcsec.sensors.base import FsRoot, SensorContext
from hpcsec.sensors.file_access.identity import AssetIndex
from hpcsec.sensors.file_access.sensor import FileAccessSensor

root_only = pytest.mark.skipif(os.geteuid() != 0, reason="fanotify and runuser need root")


@pytest.fixture
def tree():
    """/top/model/shard (the asset, root's, readable) and /top/alice (alice's own)."""
    slurm_harness.ensure_users()
    top = Path(tempfile.mkdtemp(prefix="hpcsec-identity-"))
    top.chmod(0o755)
    (top / "model").mkdir(mode=0o755)
    shard = top / "model" / "shard-0.safetensors"
    shard.write_bytes(b"s" * 64)
    shard.chmod(0o644)
    (top / "alice").mkdir()
    shutil.chown(top / "alice", "alice", "alice")
    yield top
    shutil.rmtree(top, ignore_errors=True)


def as_alice(script: str) -> None:
    done = subprocess.run(
        ["runuser", "-u", "alice", "--", "sh", "-c", script], capture_output=True, timeout=10
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.endswith(b"s" * 64)


def stream(top: Path):
    ctx = SensorContext(
        "node",
        FsRoot("sys", "/sys"),
        FsRoot("proc", "/proc"),
        FsRoot("etc", "/etc"),
        options={"watch": [str(top / "model")], "stream": True},
    )
    sensor = FileAccessSensor()
    assert list(sensor.collect(ctx)) == []
    return sensor, ctx


def reads(sensor, ctx, count: int) -> list[dict]:
    events: list[dict] = []
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        events += [e for e in sensor.collect(ctx) if e.get("event.action") == "read"]
        if len(events) >= count:
            break
        time.sleep(0.05)
    return events


@root_only
def test_a_bind_mount_in_a_user_namespace_hard_link_symlink_and_dotdot_are_the_asset(tree):
    shard = tree / "model" / "shard-0.safetensors"
    mine = tree / "alice"
    os.link(shard, mine / "innocent.bin")  # a hard link nobody watches (made by its owner)
    sensor, ctx = stream(tree)
    try:
        as_alice(
            f"mkdir {mine}/view && unshare -Urm sh -c "
            f"'mount --bind {tree}/model {mine}/view && cat {mine}/view/shard-0.safetensors'"
        )
        as_alice(f"cat {mine}/innocent.bin")
        as_alice(f"ln -s {shard} {mine}/link && cat {mine}/link")
        as_alice(f"cat {mine}/../model/shard-0.safetensors")
        events = reads(sensor, ctx, 4)
    finally:
        sensor.close()
    assert len(events) == 4
    assert {e["hpcsec.asset.path"] for e in events} == {str(shard)}
    assert all(e["user.name"] == "alice" for e in events)
    seen = sorted(e["file.path"] for e in events)
    # the bind mount lives in alice's mount namespace: the path there is whatever it is,
    # and the asset is still named; the hard link keeps its own path
    assert str(mine / "innocent.bin") in seen
    assert seen.count(str(shard)) >= 2  # the symlink and `..` resolve to the file itself


def test_the_index_names_each_file_by_device_and_inode_and_is_bounded(tmp_path):
    (tmp_path / "a").write_text("a")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "b").write_text("b")
    os.symlink(tmp_path / "a", tmp_path / "sub" / "link")  # not a file of its own
    index = AssetIndex([str(tmp_path)])
    index.build()
    a, b = os.stat(tmp_path / "a"), os.stat(tmp_path / "sub" / "b")
    assert index.lookup(a.st_dev, a.st_ino) == str(tmp_path / "a")
    assert index.lookup(b.st_dev, b.st_ino) == str(tmp_path / "sub" / "b")
    assert len(index.files) == 2 and not index.truncated
    small = AssetIndex([str(tmp_path)], max_files=1)
    small.build()
    assert len(small.files) == 1 and small.truncated

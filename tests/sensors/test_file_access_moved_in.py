"""A file or a directory moved into a protected tree from outside it (one rename on the same
filesystem: the commonest way to plant or swap a file) is an event about the protected file,
as a write in place is: `file.path` and `hpcsec.asset.path` are where it now lies, and the
bundled dataset rules fire on it. Real fanotify, the mover an unprivileged user."""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest
import slurm_harness

from hpcsec.detector.config.site import SiteConfig, load_config
from hpcsec.detector.engine.evaluate import Engine
from hpcsec.detector.engine.loader import bundled_rules_dir, load_rules
from hpcsec.detector.enrich.policy import policy_for
from hpcsec.sensors.base import FsRoot, SensorContext
from hpcsec.sensors.file_access import fanotify as fan
from hpcsec.sensors.file_access.sensor import FileAccessSensor

root_only = pytest.mark.skipif(os.geteuid() != 0, reason="fanotify and runuser need root")
NON_PUBLISHER = "002b7b30-aff2-42bd-bdc4-f1ceeca24e61"  # Read-only dataset modified by ...
PICKLE_DROPPED = "5fef83e7-04d7-498d-93f7-be6dc1641698"  # Code or pickle file dropped ...


@pytest.fixture
def node():
    """A dataset only its publisher may write, in a directory others can write in (as the
    red team found it), and a scratch directory on the same filesystem."""
    slurm_harness.ensure_users()
    top = Path(tempfile.mkdtemp(prefix="hpcsec-movedin-"))
    top.chmod(0o755)
    c4 = top / "datasets" / "c4"
    (c4 / "grp").mkdir(parents=True)
    (c4 / "grp" / "shard.bin").write_bytes(b"s" * 64)
    for directory in (c4, c4 / "grp"):
        directory.chmod(0o777)
    (top / "scratch").mkdir(mode=0o777)
    (top / "scratch").chmod(0o1777)
    (top / "site.yml").write_text(
        "assets:\n"
        "  - name: c4\n"
        "    kind: dataset\n"
        f'    paths: ["{c4}/**"]\n'
        "    writers: {users: [svc-data]}\n"
    )
    yield top
    shutil.rmtree(top, ignore_errors=True)


def as_alice(script: str, cwd: Path) -> None:
    done = subprocess.run(
        ["runuser", "-u", "alice", "--", "sh", "-c", script],
        cwd=cwd,
        capture_output=True,
        timeout=10,
    )
    assert done.returncode == 0, done.stderr


def renames_until(sensor, ctx, paths: set[str], limit_s: float = 15.0) -> list[dict]:
    """The sensor's events until a rename of each of `paths` was seen (or the limit)."""
    events: list[dict] = []
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        events += list(sensor.collect(ctx))
        if paths <= {e.get("file.path") for e in events if e["event.action"] == "rename"}:
            break
        time.sleep(0.05)
    return events


def without_fan_rename(monkeypatch) -> None:
    """The FID group as before Linux 5.17: no FAN_RENAME, the two halves of a move."""
    real = fan.mark_at

    def mark_at(group, flags, mask, *where):
        if mask & fan.FAN_RENAME:
            raise OSError(errno.EINVAL, os.strerror(errno.EINVAL))
        return real(group, flags, mask, *where)

    monkeypatch.setattr(fan, "mark_at", mark_at)


def live_stream(node: Path) -> tuple[SiteConfig, SensorContext]:
    """The node's site config, and a context for the live fanotify stream under it."""
    config = load_config(node / "site.yml", cache=False)
    roots = (FsRoot("sys", "/sys"), FsRoot("proc", "/proc"), FsRoot("etc", "/etc"))
    return config, SensorContext("node", *roots, config=config, options={"stream": True})


@root_only
@pytest.mark.parametrize("kernel", ["FAN_RENAME", "FAN_MOVED_TO"])
def test_files_and_a_directory_moved_in_are_events_about_the_dataset(node, monkeypatch, kernel):
    if kernel == "FAN_MOVED_TO":
        without_fan_rename(monkeypatch)
    config, ctx = live_stream(node)
    c4 = node / "datasets" / "c4"
    moved_in, replaced = str(c4 / "moved_in.pkl"), str(c4 / "grp" / "shard.bin")
    directory = str(c4 / "dir_moved_in")
    in_directory = f"{directory}/indir.pkl"
    sensor = FileAccessSensor()
    try:
        list(sensor.collect(ctx))  # starts the stream
        if sensor._watch.fid_fd < 0:
            pytest.skip("no fanotify FID mode: renames are not reported here")
        as_alice(f"echo x > scratch/a.pkl && mv scratch/a.pkl {moved_in}", node)
        as_alice(f"echo evil > scratch/evil.bin && mv -f scratch/evil.bin {replaced}", node)
        as_alice(
            f"mkdir scratch/dd && echo p > scratch/dd/indir.pkl && mv scratch/dd {directory}",
            node,
        )
        events = renames_until(sensor, ctx, {moved_in, replaced, directory, in_directory})
    finally:
        sensor.close()
    assert not [e for e in events if e["event.action"] == "error"]  # nothing the reader failed
    renames = {e["file.path"]: e for e in events if e["event.action"] == "rename"}
    # each about the protected file where it now lies; nothing named by the scratch path
    assert set(renames) == {moved_in, replaced, directory, in_directory}
    for path, event in renames.items():
        assert event["hpcsec.asset.path"] == path
        assert event["file.target_path"] == path  # the new path of the rename
    assert renames[moved_in]["file.extension"] == "pkl"
    assert renames[moved_in]["file.directory"] == str(c4)
    assert not [e for e in events if "scratch" in str(e.get("file.path"))]

    policy = policy_for(config)
    for event in events:
        policy.apply(event)
    engine = Engine(load_rules([bundled_rules_dir() / "data_poisoning.yml"]))
    fired = {(m.rule.id, m.events[0]["file.path"]) for m in engine.evaluate(events)}
    assert {(NON_PUBLISHER, path) for path in renames} <= fired
    assert {(PICKLE_DROPPED, moved_in), (PICKLE_DROPPED, in_directory)} <= fired


@root_only
@pytest.mark.parametrize("kernel", ["FAN_RENAME", "FAN_MOVED_TO"])
def test_a_move_out_or_within_the_tree_is_about_the_old_path(node, monkeypatch, kernel):
    """Moved out (its new directory unwatched: FAN_RENAME names the old end alone) or
    within the tree: the old path is the event's and the asset's."""
    if kernel == "FAN_MOVED_TO":
        without_fan_rename(monkeypatch)
    _, ctx = live_stream(node)
    c4 = node / "datasets" / "c4"
    (c4 / "keep.bin").write_bytes(b"k")
    shard, kept, renamed = c4 / "grp" / "shard.bin", c4 / "keep.bin", c4 / "renamed.bin"
    sensor = FileAccessSensor()
    try:
        list(sensor.collect(ctx))
        if sensor._watch.fid_fd < 0:
            pytest.skip("no fanotify FID mode: renames are not reported here")
        as_alice(f"mv {shard} scratch/stolen.bin && mv {kept} {renamed}", node)
        wanted = {str(shard), str(kept)} | ({str(renamed)} if kernel == "FAN_MOVED_TO" else set())
        events = renames_until(sensor, ctx, wanted)
    finally:
        sensor.close()
    renames = [e for e in events if e["event.action"] == "rename"]
    out = [e for e in renames if e["file.path"] == str(shard)]
    assert [(e["hpcsec.asset.path"], e.get("file.target_path")) for e in out] == [
        (str(shard), None)
    ]
    within = [e for e in renames if e["file.path"] == str(kept)]
    assert [e["hpcsec.asset.path"] for e in within] == [str(kept)]
    if kernel == "FAN_RENAME":
        assert within[0]["file.target_path"] == str(renamed)
        assert len(renames) == 2
    else:  # the second half, an event of its own: the file where it now lies
        assert {(e["file.path"], e.get("file.target_path")) for e in renames} == {
            (str(shard), None),
            (str(kept), None),
            (str(renamed), str(renamed)),
        }
    assert not [e for e in events if "scratch" in str(e.get("file.path"))]

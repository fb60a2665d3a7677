"""The one-shot open-files check finds a protected file held open under another path: an
unprivileged user's bind mount in a user namespace of their own (`unshare -Urm`), checked
live; the mountinfo arithmetic on hostile names (escapes, roots, lines that are not the
kernel's) checked alone."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from snapshot_builder import NodeTree

from hpcsec.sensors.file_access import mounts
from hpcsec.sensors.file_access.mounts import Mount, filesystem_path, parse_mountinfo, unescape
from hpcsec.sensors.file_access.sensor import FileAccessSensor
from tests.sensors.test_file_access import unprivileged_user

MOUNTINFO = (
    "22 27 0:21 / /proc rw,relatime - proc proc rw\n"
    "27 1 254:0 / / rw,relatime - ext4 /dev/vda rw\n"
    "66 46 254:0 /srv/models /home/mallory/a\\040b rw,relatime - ext4 /dev/vda rw\n"
    "not a mount line\n"
    "67 46 254:0\n"
    "x 46 254:0 / /y rw - ext4 /dev/vda rw\n"
)


def test_mountinfo_is_read_as_the_kernel_writes_it():
    found = parse_mountinfo(MOUNTINFO)
    assert found == {
        22: Mount("0:21", "/", "/proc"),
        27: Mount("254:0", "/", "/"),
        66: Mount("254:0", "/srv/models", "/home/mallory/a b"),
    }
    assert unescape("a\\011b\\012c\\134d") == "a\tb\nc\\d"


@pytest.mark.parametrize(
    ("mount", "path", "inside"),
    [
        (
            Mount("254:0", "/srv/models", "/home/m/x"),
            "/home/m/x/llama/w.bin",
            "/srv/models/llama/w.bin",
        ),
        (Mount("254:0", "/srv/models", "/home/m/x"), "/home/m/x", "/srv/models"),
        (Mount("254:0", "/srv/models", "/home/m/x"), "/home/m/xy/w.bin", None),  # not under it
        (Mount("254:0", "/", "/"), "/srv/models/w.bin", "/srv/models/w.bin"),
        (Mount("254:0", "/", "/mnt"), "/mnt/srv/w.bin", "/srv/w.bin"),
        (Mount("254:0", "/srv", "/"), "/models/w.bin", "/srv/models/w.bin"),
    ],
)
def test_a_path_seen_through_a_mount_is_placed_in_its_filesystem(mount, path, inside):
    assert filesystem_path(mount, path) == inside


def test_past_the_namespace_cap_files_are_matched_by_path_only(tmp_path, monkeypatch):
    """Any user can make mount namespaces: only the first MAX_NAMESPACES are read in one
    walk, the rest are counted, not read."""
    monkeypatch.setattr(mounts, "MAX_NAMESPACES", 1)
    proc = tmp_path / "proc"
    for pid in ("10", "11", "12"):
        (proc / pid / "fdinfo").mkdir(parents=True)
        (proc / pid / "fdinfo" / "3").write_text("pos:\t0\nflags:\t0100000\nmnt_id:\t66\nino:\t5\n")
        (proc / pid / "mountinfo").write_text(MOUNTINFO)
        (proc / pid / "ns").mkdir()
        os.symlink(f"mnt:[40265318{pid}]", proc / pid / "ns" / "mnt")
    (proc / "self").mkdir()
    (proc / "self" / "mountinfo").write_text(MOUNTINFO)
    ctx = NodeTree(tmp_path / "node").context()
    ctx.proc.path = proc
    identity = mounts.Identity.here(ctx.proc)
    assert identity is not None
    path = "/home/mallory/a b/llama/w.bin"
    # where that file lies here: through the same bind mount, and through `/`
    assert identity.candidates("10", "3", path) == [(path, 5), ("/srv/models/llama/w.bin", 5)]
    assert identity.candidates("11", "3", path) == []
    assert identity.skipped_namespaces == 1


@pytest.fixture
def readable_dir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="hpcsec-bind-"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _user_namespaces_for(user: str) -> bool:
    probe = subprocess.run(
        ["runuser", "-u", user, "--", "unshare", "-Urm", "true"], capture_output=True
    )
    return probe.returncode == 0


@pytest.mark.skipif(os.geteuid() != 0, reason="runs a process as another user")
def test_a_bind_mount_in_a_users_own_namespace_does_not_hide_a_held_model(readable_dir):
    user = unprivileged_user().pw_name
    if not shutil.which("unshare") or not _user_namespaces_for(user):
        pytest.skip("this kernel does not let an unprivileged user make a user namespace")
    models, disguise, elsewhere = (readable_dir / n for n in ("models", "m", "scratch"))
    for directory in (models, disguise, elsewhere):
        directory.mkdir(mode=0o755)
        directory.chmod(0o755)
    (models / "w.safetensors").write_bytes(b"weights")
    (elsewhere / "notes.txt").write_bytes(b"notes")
    for f in (models / "w.safetensors", elsewhere / "notes.txt"):
        f.chmod(0o644)
    script = (
        f"mount --bind '{models}' '{disguise}' && exec 3<'{disguise}/w.safetensors' "
        f"4<'{elsewhere}/notes.txt' && exec sleep 30"
    )
    child = subprocess.Popen(["runuser", "-u", user, "--", "unshare", "-Urm", "sh", "-c", script])
    try:
        ctx = NodeTree(readable_dir / "node").context(watch=[str(models), str(readable_dir / "x")])
        ctx.proc.path, ctx.etc.path = Path("/proc"), Path("/etc")
        events: list[dict] = []
        for _ in range(100):  # until the shell has opened it and exec'd sleep
            events = [
                e
                for e in FileAccessSensor().collect(ctx)
                if e.get("process.name") == "sleep" and e.get("user.name") == user
            ]
            if events:
                break
            time.sleep(0.05)
        assert [(e["file.path"], e["hpcsec.asset.path"]) for e in events] == [
            (f"{disguise}/w.safetensors", f"{models}/w.safetensors")
        ]
    finally:
        child.kill()
        child.wait()


@pytest.mark.parametrize("shift", [0, 1])
def test_a_protected_path_counts_only_when_it_is_the_same_inode(tmp_path, shift):
    """The path worked out from the opener's mounts is taken only when an lstat there shows
    the inode the descriptor holds: a file replaced since (or a forged fdinfo) is not."""
    from hpcsec.sensors.file_access import fdwalk

    models = tmp_path / "models"
    models.mkdir()
    weights = models / "w.bin"
    weights.write_bytes(b"w")
    proc = tmp_path / "proc"
    (proc / "self").mkdir(parents=True)
    (proc / "self" / "mountinfo").write_text("27 1 254:0 / / rw - ext4 /dev/vda rw\n")
    pid = proc / "4242"
    for sub in ("fd", "fdinfo", "ns"):
        (pid / sub).mkdir(parents=True)
    os.symlink("/disguise/w.bin", pid / "fd" / "3")
    ino = weights.stat().st_ino + shift
    (pid / "fdinfo" / "3").write_text(f"pos:\t0\nflags:\t0100000\nmnt_id:\t66\nino:\t{ino}\n")
    (pid / "mountinfo").write_text(f"66 46 254:0 {models} /disguise rw - ext4 /dev/vda rw\n")
    os.symlink("mnt:[4026532000]", pid / "ns" / "mnt")
    ctx = NodeTree(tmp_path / "node").context()
    ctx.proc.path = proc
    protected = lambda path: path.startswith(f"{models}/")  # noqa: E731
    records = fdwalk.open_files(ctx, protected, mounts.Identity.here(ctx.proc))
    found = [(r.pid, r.path, r.asset) for r in records]
    assert found == ([] if shift else [(4242, "/disguise/w.bin", str(weights))])
    assert fdwalk.open_files(ctx, protected) == []  # by the link's text alone: not seen

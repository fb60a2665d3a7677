"""Allow-lists match exact identities: LD_PRELOAD library paths, GPU services by executable
and owner, long names by the executable's file name (comm is 15 characters)."""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

import pytest

from hpcsec.detector.config.site import load_config
from hpcsec.detector.enrich.policy import policy_for, preload_allowed
from hpcsec.sensors.base import FsRoot, SensorContext
from hpcsec.sensors.process import ProcessSensor
from tests.hostile_fs import as_root

DEFAULT = ("libtcmalloc", "libjemalloc")
LIB = "/usr/lib/x86_64-linux-gnu"


@pytest.mark.parametrize(
    ("value", "allowed"),
    [
        (f"{LIB}/libjemalloc.so.2", True),
        (f"{LIB}/libjemalloc.so.2 /usr/lib64/libtcmalloc.so.4:/lib/libjemalloc.so", True),
        (f"evil.so:{LIB}/libjemalloc.so.2", False),  # every entry is judged
        (f"/tmp/evil.so:{LIB}/libjemalloc.so.2", False),
        (f"{LIB}/libjemalloc-hook.so", False),  # a name, not a prefix
        ("/home/alice/libjemalloc.so.2", False),  # the user's own copy
        ("libjemalloc.so.2", False),  # found through LD_LIBRARY_PATH, which the user sets
        (f"{LIB}/../../../tmp/libjemalloc.so.2", False),
        ("", False),
    ],
)
def test_every_preloaded_library_must_be_allowed(value, allowed):
    assert preload_allowed(value, DEFAULT) is allowed


def test_a_site_entry_with_a_slash_is_a_path_and_its_star_stays_in_one_component():
    allowed = ("/opt/darshan/*/lib/libdarshan.so",)
    assert preload_allowed("/opt/darshan/3.4.4/lib/libdarshan.so", allowed)
    assert not preload_allowed("/opt/darshan/3.4.4/evil/lib/libdarshan.so", allowed)
    assert not preload_allowed(f"{LIB}/libdarshan.so", allowed)


@pytest.fixture
def config(tmp_path):
    path = tmp_path / "site.yml"
    path.write_text("gpu_services: [nv-hostengine, nvidia-persistenced, /opt/dcgm/bin/nvvs]\n")
    return load_config(path)


def process(uid: object, name: str, exe: str | None, **more) -> dict:
    event = {"event.category": "gpu_process", "user.id": uid, "process.name": name, **more}
    if exe is not None:
        event["process.executable"] = exe
    return event


@pytest.mark.parametrize(
    ("event", "service"),
    [
        (process(0, "nv-hostengine", "/usr/bin/nv-hostengine"), True),
        (process(0, "nv-hostengine", "/usr/bin/nv-hostengine (deleted)"), True),  # upgraded
        (process(1001, "nv-hostengine", "/home/alice/nv-hostengine"), False),  # a user's copy
        (process(1001, "nv-hostengine", "/usr/bin/nv-hostengine"), False),  # run by a user
        (process(0, "nv-hostengine", "/usr/bin/python3"), False),  # exec -a nv-hostengine
        (process(0, "nvidia-persiste", "/usr/bin/nvidia-persistenced"), True),  # 15-char comm
        (process(0, "nvidia-persiste", None), True),  # no executable: comm, cut like the kernel
        (process(0, "nvvs", "/opt/dcgm/bin/nvvs"), True),  # a path entry: that path only
        (process(0, "nvvs", "/usr/bin/nvvs"), False),
        (process(True, "nv-hostengine", "/usr/bin/nv-hostengine"), False),  # JSON true: no uid
        (process("0", "nv-hostengine", "/usr/bin/nv-hostengine"), False),  # text: no uid
        (process(0, "nv-hostengine", "nv-hostengine"), True),  # a name without a directory
    ],
)
def test_gpu_services_by_executable_and_owner(config, event, service):
    policy_for(config).apply(event, "gpu-017")
    assert event["process.is_gpu_service"] is service


def test_the_executable_name_is_set_for_long_names(config):
    event = process(1001, "nvidia-smi-flas", "/usr/bin/nvidia-smi-flash")
    policy_for(config).apply(event, "gpu-017")
    assert event["process.executable_name"] == "nvidia-smi-flash"


def test_ld_preload_allowed_is_set_from_the_default_list(config):
    ok = process(1001, "python3", None, **{"process.env.LD_PRELOAD": f"{LIB}/libtcmalloc.so.4"})
    bad = process(1001, "python3", None, **{"process.env.LD_PRELOAD": "/tmp/libjemalloc.so"})
    for event in (ok, bad):
        policy_for(config).apply(event, "gpu-017")
    assert (ok["process.ld_preload_allowed"], bad["process.ld_preload_allowed"]) == (True, False)


@as_root
def test_a_users_own_copy_named_like_a_gpu_service_is_not_exempt(config, tmp_path, shared):
    """alice copies sleep to nv-hostengine and runs it: it is not the site's service."""
    copy = Path(shared) / "nv-hostengine"
    shutil.copy("/bin/sleep", copy)
    copy.chmod(0o755)
    proc = subprocess.Popen(["runuser", "-u", "alice", "--", str(copy), "2718"])
    try:
        ctx = SensorContext(
            "h", FsRoot("sys", "/sys"), FsRoot("proc", "/proc"), FsRoot("etc", "/etc")
        )
        for _ in range(100):
            mine = [
                e for e in ProcessSensor().collect(ctx) if e.get("process.executable") == str(copy)
            ]
            if mine:
                break
            time.sleep(0.05)
        assert mine and mine[0]["process.name"] == "nv-hostengine"
        policy_for(config).apply(mine[0], "h")
        assert mine[0]["process.is_gpu_service"] is False
    finally:
        proc.kill()
        proc.wait()

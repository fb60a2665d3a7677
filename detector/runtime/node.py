"""Build the SensorContext for this node (live) from command-line roots and the config."""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

from hpcsec.detector.config.site import SiteConfig
from hpcsec.sensors.base import FsRoot, Recorder, SensorContext
from hpcsec.sensors.cmdline_condense import Literals


def live_context(
    config: SiteConfig,
    sysfs_root: str | Path = "/sys",
    procfs_root: str | Path = "/proc",
    etc_root: str | Path = "/etc",
    host_name: str | None = None,
    recorder: Recorder | None = None,
    options: dict[str, Any] | None = None,
    cmdline_literals: Literals | None = None,
) -> SensorContext:
    return SensorContext(
        host_name=host_name or socket.gethostname().split(".")[0],
        sys=FsRoot("sys", sysfs_root, recorder),
        proc=FsRoot("proc", procfs_root, recorder),
        etc=FsRoot("etc", etc_root, recorder),
        config=config,
        options=dict(options or {}),
        recorder=recorder,
        cmdline_literals=cmdline_literals,
    )
